"""Where telemetry goes as OpenTelemetry's own environment variables say: the collector of
`OTEL_EXPORTER_OTLP_ENDPOINT` where Tempered names none, nothing at all under
`OTEL_SDK_DISABLED`, their export timeout and metric interval kept when set; an endpoint without
a scheme refused when telemetry is set up, not when the Temporal runtime is made."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc import metric_exporter, trace_exporter
from temporalio.runtime import Runtime

from infra import telemetry as tm
from infra.settings import Settings
from infra.telemetry_export import OTLP_TIMEOUT_S


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(autouse=True)
def _no_otel_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the variables it is about; none leak in from the shell."""
    for name in (
        "OTEL_SDK_DISABLED",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TIMEOUT",
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
        "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
        "OTEL_METRIC_EXPORT_INTERVAL",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tm, "SHUTDOWN_S", 0.5)  # nothing answers at the collectors here


@pytest.fixture
def timeouts(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The timeout each OTLP exporter was made with: "span" and "metric"."""
    made: dict[str, Any] = {}

    class Spans(trace_exporter.OTLPSpanExporter):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made["span"] = kwargs.get("timeout")
            super().__init__(*args, **kwargs)

    class Metrics(metric_exporter.OTLPMetricExporter):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made["metric"] = kwargs.get("timeout")
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(trace_exporter, "OTLPSpanExporter", Spans)
    monkeypatch.setattr(metric_exporter, "OTLPMetricExporter", Metrics)
    return made


def test_the_otel_endpoint_is_used_where_tempered_names_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeouts: dict[str, Any]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{_free_port()}")
    telemetry = tm.setup_telemetry(Settings(home=tmp_path), "learner", export_interval_s=3600)
    telemetry.shutdown()
    assert telemetry.jsonl_path is None and not (tmp_path / "telemetry").exists()
    assert timeouts == {"span": OTLP_TIMEOUT_S, "metric": OTLP_TIMEOUT_S}


def test_otels_own_export_timeout_is_kept_when_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, timeouts: dict[str, Any]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "30")
    endpoint = f"http://127.0.0.1:{_free_port()}"
    settings = Settings(home=tmp_path, telemetry={"otlp_endpoint": endpoint})
    tm.setup_telemetry(settings, "learner", export_interval_s=3600).shutdown()
    assert timeouts == {"span": None, "metric": None}  # None: each exporter reads the variable
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TIMEOUT")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "9")  # one signal's own
    tm.setup_telemetry(settings, "learner", export_interval_s=3600).shutdown()
    assert timeouts == {"span": None, "metric": OTLP_TIMEOUT_S}


def test_otels_own_metric_interval_is_kept_when_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")  # milliseconds
    telemetry = tm.setup_telemetry(Settings(home=tmp_path), "sandbox")  # no interval of its own
    try:
        assert telemetry.jsonl_path is not None
        deadline = time.monotonic() + 5
        snapshots = 0
        while snapshots < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            lines = telemetry.jsonl_path.read_text().splitlines()
            snapshots = sum(json.loads(line)["kind"] == "metrics" for line in lines)
    finally:
        telemetry.shutdown()
    assert snapshots >= 2, "no snapshot every 100 ms: the default 10 s interval was kept"


def test_otel_sdk_disabled_exports_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    port = _free_port()
    settings = Settings(home=tmp_path, telemetry={"prometheus_port": port - 2})
    telemetry = tm.setup_telemetry(settings, "sandbox", export_interval_s=60)
    try:
        tm.record_sandbox_run("local", "passed", 0.1)
        with tm.span("sandbox.run") as current:
            assert not current.is_recording()
        assert telemetry.jsonl_path is None and telemetry.prometheus_port is None
        assert telemetry.temporal_runtime() is Runtime.default()
        telemetry.flush()
    finally:
        telemetry.shutdown()
    assert not (tmp_path / "telemetry").exists()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # no Prometheus endpoint was opened on it


@pytest.mark.parametrize("endpoint", ["127.0.0.1:4317", "localhost:4317", "grpc://collector:4317"])
@pytest.mark.parametrize("source", ["settings", "OTEL_EXPORTER_OTLP_ENDPOINT"])
def test_an_endpoint_without_a_scheme_is_refused_at_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, endpoint: str, source: str
) -> None:
    """`127.0.0.1:4317` made `temporal_runtime()` raise as the worker started, and with
    `localhost:4317` the Python exporters chose TLS for a plaintext collector."""
    settings = Settings(home=tmp_path)
    if source == "settings":
        settings.telemetry.otlp_endpoint = endpoint  # past the settings' own check, if any
    else:
        monkeypatch.setenv(source, endpoint)
    with pytest.raises(ValueError, match=f"OTLP endpoint '{endpoint}'.*http://.*https://"):
        tm.setup_telemetry(settings, "learner", export_interval_s=3600)
    assert not (tmp_path / "telemetry").exists()
