"""The schema refuses the values the workers' settings refuse at start: `helm lint --strict`
passed `s3.endpoint=minio.storage:9000`, an empty `s3.region`, `telemetry.otlpEndpoint=otel:4317`,
`temporal.address=temporal:0` and `sandbox.runtimeClass.name=gVisor_RC`, and then every worker
exited at start (the settings model, infra/settings.py, refused them).

Each value is linted and given to the model's field as the chart writes it (an empty OTLP
endpoint or RuntimeClass is not written): the verdicts agree, but where the schema is stricter
on purpose (`STRICTER`). Skipped without helm.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable

import pytest
from pydantic import ValidationError

from infra.settings import S3Settings, TelemetrySettings, TemporalSettings
from infra.settings_backends import DNS_SUBDOMAIN, KubernetesSandboxSettings
from tests.charts.chart import CHART, HELM, needs_helm, with_credentials

pytestmark = needs_helm

MODEL: dict[str, Callable[[str], object]] = {
    "s3.endpoint": lambda v: S3Settings(endpoint=v),
    "s3.region": lambda v: S3Settings(region=v),
    "telemetry.otlpEndpoint": lambda v: TelemetrySettings(otlp_endpoint=v or None),
    "temporal.address": lambda v: TemporalSettings(address=v),
    "sandbox.runtimeClass.name": lambda v: KubernetesSandboxSettings(runtime_class=v or None),
}
"""How the worker reads each value (tempered.settingsData in templates/_settings.tpl)."""

CASES = [
    ("s3.endpoint", "http://minio.storage:9000"),
    ("s3.endpoint", "https://s3.eu-west-1.amazonaws.com"),
    ("s3.endpoint", "http://10.0.0.7:8333/"),
    ("s3.endpoint", "minio.storage:9000"),
    ("s3.endpoint", "ftp://minio.storage:9000"),
    ("s3.endpoint", "http://"),
    ("s3.endpoint", "http://minio:0"),
    ("s3.endpoint", "http://minio:65536"),
    ("s3.region", "eu-west-1"),
    ("s3.region", ""),
    ("telemetry.otlpEndpoint", ""),
    ("telemetry.otlpEndpoint", "http://otel-collector.observability:4317"),
    ("telemetry.otlpEndpoint", "https://otel.example.com"),
    ("telemetry.otlpEndpoint", "otel:4317"),
    ("telemetry.otlpEndpoint", "grpc://otel:4317"),
    ("temporal.address", "temporal-frontend.temporal:7233"),
    ("temporal.address", "127.0.0.1:65535"),
    ("temporal.address", "temporal:0"),
    ("temporal.address", "temporal:65536"),
    ("temporal.address", "temporal"),
    ("temporal.address", ":7233"),
    ("sandbox.runtimeClass.name", ""),
    ("sandbox.runtimeClass.name", "gvisor"),
    ("sandbox.runtimeClass.name", "kata-qemu.v2"),
    ("sandbox.runtimeClass.name", "gVisor_RC"),
    ("sandbox.runtimeClass.name", "-gvisor"),
]
STRICTER = {
    # the NetworkPolicy reads the port with sprig's int, which takes a leading 0 as octal
    # (7233 as 3739, 8333 as 0): the model reads them as decimal
    ("temporal.address", "temporal:07233"): "a port's leading zero",
    ("s3.endpoint", "http://minio:08333"): "a port's leading zero",
    # the NetworkPolicy's port: sprig's int of "abc" is 0, and the rule was left out
    ("telemetry.otlpEndpoint", "http://otel:abc"): "a port that is no number",
    ("s3.endpoint", "http://key:secret@minio:9000"): "credentials in the URL",
}


def lint_error(key: str, value: str) -> str | None:
    """helm lint --strict's output where it refuses `key=value`, else None."""
    assert HELM is not None
    args = ("lint", "--strict", str(CHART), "--set-string", f"{key}={value}")
    done = subprocess.run(
        [HELM, *with_credentials(args)], capture_output=True, text=True, timeout=120
    )
    return None if done.returncode == 0 else done.stdout + done.stderr


def model_takes(key: str, value: str) -> bool:
    try:
        MODEL[key](value)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize(("key", "value"), CASES)
def test_the_schema_refuses_what_the_settings_refuse(key: str, value: str) -> None:
    error = lint_error(key, value)
    assert (error is None) is model_takes(key, value), error
    if error is not None:
        assert key.rsplit(".", 1)[-1] in error, error


@pytest.mark.parametrize(("key", "value"), list(STRICTER))
def test_the_schema_is_stricter_where_the_chart_reads_the_value_itself(
    key: str, value: str
) -> None:
    assert model_takes(key, value), STRICTER[(key, value)]
    error = lint_error(key, value)
    assert error is not None and key.rsplit(".", 1)[-1] in error, STRICTER[(key, value)]


def test_the_runtime_class_pattern_is_the_models() -> None:
    """One rule, the model's (infra/settings_backends.py DNS_SUBDOMAIN), or empty (none)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    name = schema["properties"]["sandbox"]["properties"]["runtimeClass"]["properties"]["name"]
    assert name["pattern"] == f"^({DNS_SUBDOMAIN.removeprefix('^').removesuffix('$')})?$"
