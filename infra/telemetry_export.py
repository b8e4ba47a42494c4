"""Where a worker's telemetry goes: Tempered's settings, then OpenTelemetry's own variables.

    export = export_config(settings, export_interval_s)      # reads os.environ
    export.disabled, export.endpoint, export.span_timeout_s, export.interval_ms

`infra.telemetry.setup_telemetry` builds its exporters from it:

- `OTEL_SDK_DISABLED=true`: nothing is exported (no file, no collector, no Prometheus endpoint,
  the Temporal SDK's default runtime).
- the collector: `settings.telemetry.otlp_endpoint`, else `OTEL_EXPORTER_OTLP_ENDPOINT`, else
  none (JSONL files under `<home>/telemetry/`). Either must be an `http://` (plaintext) or
  `https://` (TLS) URL (`check_otlp_endpoint`): the Temporal runtime refuses one without a
  scheme, and the Python exporters take `localhost:4317` for a TLS collector.
- each exporter's timeout: `OTLP_TIMEOUT_S`, unless `OTEL_EXPORTER_OTLP_TIMEOUT` or the signal's
  own (`OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, `…_METRICS_TIMEOUT`) is set: the exporter reads it.
- the metric interval: the caller's, else `OTEL_METRIC_EXPORT_INTERVAL` (read by the reader),
  else `EXPORT_INTERVAL_S`. The run profile takes `DOWN_AFTER_S` (30 s) without a record as
  workers down (`infra.telemetry_profile`): an interval as long reads live workers as down.

Not covered: the signals' own endpoints (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, …): the one
endpoint chosen here goes to both exporters and to the Temporal runtime.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:  # infra.settings may import the check below: no import of it at run time
    from infra.settings import Settings

OTLP_TIMEOUT_S = 2.0
"""One export to the OTLP collector, its retries included (the exporters' default: 10 s)."""
EXPORT_INTERVAL_S = 10.0
"""Seconds between a worker's metric snapshots where neither caller nor environment says."""


@dataclass(frozen=True)
class Export:
    """What `setup_telemetry` exports, and where; a timeout or interval of None is the
    OpenTelemetry variable's, which the exporter or reader reads itself."""

    disabled: bool
    endpoint: str | None
    span_timeout_s: float | None
    metric_timeout_s: float | None
    interval_ms: float | None


def check_otlp_endpoint(endpoint: str) -> str:
    """`endpoint` if it is an http:// or https:// URL with a host, else ValueError."""
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(
            f"OTLP endpoint {endpoint!r} is not a URL: write http://{parts.netloc or endpoint} "
            "for a plaintext collector, or https://… for one that speaks TLS"
        )
    return endpoint


def export_config(
    settings: Settings, export_interval_s: float | None, environ: Mapping[str, str] = os.environ
) -> Export:
    """What `setup_telemetry` exports for `settings` under `environ`; ValueError for an
    endpoint without a scheme (`check_otlp_endpoint`)."""
    endpoint = settings.telemetry.otlp_endpoint or environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if endpoint:
        check_otlp_endpoint(endpoint)
    if export_interval_s is not None:
        interval_ms: float | None = export_interval_s * 1000
    elif environ.get("OTEL_METRIC_EXPORT_INTERVAL"):
        interval_ms = None
    else:
        interval_ms = EXPORT_INTERVAL_S * 1000
    return Export(
        disabled=environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true",
        endpoint=endpoint or None,
        span_timeout_s=_timeout(environ, "TRACES"),
        metric_timeout_s=_timeout(environ, "METRICS"),
        interval_ms=interval_ms,
    )


def _timeout(environ: Mapping[str, str], signal: str) -> float | None:
    own = ("OTEL_EXPORTER_OTLP_TIMEOUT", f"OTEL_EXPORTER_OTLP_{signal}_TIMEOUT")
    return None if any(environ.get(name) for name in own) else OTLP_TIMEOUT_S
