"""Settings that loaded but failed later, or could not be given at all: `telemetry.
prometheus_host` took any string (`localhost` and `::` passed Python's metrics server, then the
Temporal SDK's runtime refused "Invalid Prometheus address", naming no setting; `[::]` failed the
server), and `omp_spin_count`'s None (libgomp's default) could not be written in the
environment, a file or the chart ("Input should be a valid integer").

Every test runs in an empty working directory with no `TEMPERED_*` variables set.
"""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from infra import telemetry as tm
from infra.settings import Settings, load_settings
from tests.fixtures.settings_env import refusal

pytestmark = pytest.mark.usefixtures("clean")  # tests/fixtures/settings_env.py


# -- telemetry.prometheus_host -----------------------------------------------------------------


@pytest.mark.parametrize(
    "host", ["localhost", "[::]", "[::1]", "", "0.0.0.0:9460", "fe80::1%eth0", "01.2.3.4"]
)
def test_a_prometheus_host_that_is_no_ip_literal_is_refused_naming_the_setting(
    host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEMPERED_TELEMETRY__PROMETHEUS_HOST", host)
    message = refusal()
    assert "telemetry.prometheus_host" in message, message
    assert "TEMPERED_TELEMETRY__PROMETHEUS_HOST" in message, message
    assert "IP address" in message, message


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::", "::1", "::ffff:127.0.0.1"])
def test_ip_literals_pass(host: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPERED_TELEMETRY__PROMETHEUS_HOST", host)
    assert load_settings().telemetry.prometheus_host == host


def _free_v6_pair(shift: int) -> int:
    """A port free on ::1, and so is the one `shift` above it."""
    for _ in range(100):
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
            port = int(sock.getsockname()[1])
        if port + shift > 65535:
            continue
        with socket.socket(socket.AF_INET6) as above:
            try:
                above.bind(("::1", port + shift))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port on ::1 with a free one {shift} above it")


def _metrics(host: str, port: int) -> int:
    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=5) as reply:
        return int(reply.status)


def test_an_ipv6_host_serves_both_the_workers_and_the_sdks_metrics(tmp_path: Path) -> None:
    """The SDK's bind address is `[host]:port` for an IPv6 host (it refused `::1:9470`)."""
    sandbox_port = _free_v6_pair(tm.SDK_PORT_SHIFT)
    settings = Settings(
        home=tmp_path,
        telemetry={"prometheus_port": sandbox_port - 2, "prometheus_host": "::1"},
    )
    telemetry = tm.setup_telemetry(settings, "sandbox", export_interval_s=60)
    try:
        telemetry.temporal_runtime()  # raised ValueError "Invalid Prometheus address"
        assert _metrics("[::1]", sandbox_port) == 200
        assert _metrics("[::1]", sandbox_port + tm.SDK_PORT_SHIFT) == 200
    finally:
        telemetry.shutdown()


# -- omp_spin_count ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", "default", "DEFAULT", " default "])
def test_omp_spin_count_default_from_the_environment_is_none(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEMPERED_OMP_SPIN_COUNT", value)
    assert load_settings().omp_spin_count is None


@pytest.mark.parametrize("value", ['""', '"default"'])
def test_omp_spin_count_default_from_a_file_is_none(value: str, tmp_path: Path) -> None:
    config = tmp_path / "t.toml"
    config.write_text(f"omp_spin_count = {value}\n")
    assert load_settings(config).omp_spin_count is None


def test_omp_spin_count_still_takes_a_number_and_refuses_other_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().omp_spin_count == 20_000
    monkeypatch.setenv("TEMPERED_OMP_SPIN_COUNT", "300000")
    assert load_settings().omp_spin_count == 300_000
    monkeypatch.setenv("TEMPERED_OMP_SPIN_COUNT", "none")
    message = refusal()
    assert "omp_spin_count" in message and "TEMPERED_OMP_SPIN_COUNT" in message, message
    monkeypatch.setenv("TEMPERED_OMP_SPIN_COUNT", "-1")
    assert "omp_spin_count" in refusal()
