"""OpenTelemetry for Tempered workers: traces, metrics, Prometheus and Temporal SDK telemetry.

Each worker calls `setup_telemetry` once at start and `shutdown()` on exit:

    telemetry = setup_telemetry(settings, "sandbox")
    client = await Client.connect(..., runtime=telemetry.temporal_runtime(),
                                  interceptors=telemetry.interceptors())
    ...
    with span("sandbox.run", task_id=t, sample=i, sandbox_backend="local"):
        record_sandbox_run("local", "passed", 0.12)
    telemetry.shutdown()

Spans and metrics go to the OTLP gRPC collector at `settings.telemetry.otlp_endpoint` (else
`OTEL_EXPORTER_OTLP_ENDPOINT`), or, without one, to `<home>/telemetry/<service>-<pid>-<started>
.jsonl` (`infra.telemetry_files`), which `read_live_figures` (used by `tempered status`)
aggregates; `OTEL_SDK_DISABLED=true` exports nothing (`infra.telemetry_export` says what of
OpenTelemetry's variables is honoured). With `settings.telemetry.prometheus_port > 0` each worker
also serves its metrics at `http://<host>:<port_for(service)>/metrics` and the Temporal SDK's
own metrics `SDK_PORT_SHIFT` ports above. The `record_*` helpers are no-ops until setup; the
instruments they record onto (names, units, buckets) are defined in `telemetry_instruments.py`.
`shutdown()` waits `SHUTDOWN_S` at most for the exporters' last flush (a collector that does not
answer costs a worker's stop no more); what they have not sent by then is lost.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import psutil
import temporalio.activity
import temporalio.client
import temporalio.worker
from opentelemetry import trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from prometheus_client import CollectorRegistry, start_http_server
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.runtime import OpenTelemetryConfig, PrometheusConfig, Runtime, TelemetryConfig

from contracts.names import Queue, is_evaluation
from infra.settings import Settings
from infra.telemetry_export import Export, export_config
from infra.telemetry_figures import LIVE_WINDOW_S, WorkerFigures
from infra.telemetry_figures import read_live_figures as _read_figures
from infra.telemetry_files import (
    JsonlMetricExporter,
    JsonlSink,
    JsonlSpanExporter,
    drop_predecessors,
    jsonl_name,
)
from infra.telemetry_instruments import CIRCUIT_STATES, Instruments

PORT_OFFSETS: dict[str, int] = {
    Queue.AGENT_TASKS: 0,
    Queue.INFERENCE: 1,
    Queue.SANDBOX: 2,
    Queue.REWARDS: 3,
    Queue.LEARNER: 4,
}
"""Prometheus port of a worker = `settings.telemetry.prometheus_port` + its offset."""
SDK_PORT_SHIFT = 10
"""The Temporal SDK's metrics of a worker are served this many ports above its own."""
SHUTDOWN_S = 3.0
"""How long `shutdown()` waits for the exporters' last flush: a worker's stop leaves
`workers.background.STOP_MARGIN_S` for all of its own shutdown."""
log = logging.getLogger("tempered.telemetry")


def prometheus_port_for(settings: Settings, service: str) -> int | None:
    """Port of `service`'s Prometheus endpoint, or None when disabled or not a worker; a
    process of several queues (`tempered worker all`: "agent-tasks+inference+…") its first's."""
    base, offset = settings.telemetry.prometheus_port, PORT_OFFSETS.get(service.split("+")[0])
    if base <= 0 or offset is None:
        return None
    return base + offset


_instruments: Instruments | None = None
_tracer: trace.Tracer = trace.NoOpTracer()
_lock = threading.Lock()


class Telemetry:
    """The providers of one worker process; `shutdown()` flushes and stops everything."""

    def __init__(
        self,
        settings: Settings,
        service: str,
        tracer_provider: TracerProvider,
        meter_provider: MeterProvider,
        jsonl: JsonlSink | None,
        prometheus_server: Any | None,
        export: Export,
    ) -> None:
        self.settings, self.service, self.export = settings, service, export
        self.tracer_provider, self.meter_provider = tracer_provider, meter_provider
        self.tracer = tracer_provider.get_tracer("tempered")
        self.meter = meter_provider.get_meter("tempered")
        self.jsonl_path: Path | None = jsonl.path if jsonl else None
        self.prometheus_port = prometheus_port_for(settings, service) if prometheus_server else None
        self._jsonl, self._prometheus_server = jsonl, prometheus_server
        self._runtime: Runtime | None = None

    def temporal_runtime(self) -> Runtime:
        """A `temporalio.runtime.Runtime` exporting the SDK's metrics (created once; the
        default runtime where nothing is to be exported)."""
        if self._runtime is None:
            port = prometheus_port_for(self.settings, self.service)
            endpoint = self.export.endpoint
            if self.export.disabled:
                port = endpoint = None
            metrics: PrometheusConfig | OpenTelemetryConfig
            if port is not None:
                host = self.settings.telemetry.prometheus_host  # an IP literal (settings)
                host = f"[{host}]" if ":" in host else host  # the SDK parses a socket address
                metrics = PrometheusConfig(bind_address=f"{host}:{port + SDK_PORT_SHIFT}")
            elif endpoint:
                metrics = OpenTelemetryConfig(url=endpoint)
            else:
                self._runtime = Runtime.default()
                return self._runtime
            global_tags = {"service_name": f"tempered-{self.service}"}
            self._runtime = Runtime(
                telemetry=TelemetryConfig(metrics=metrics, global_tags=global_tags)
            )
        return self._runtime

    def interceptors(self) -> list[temporalio.client.Interceptor]:
        """Temporal client/worker interceptors: tracing of workflows and activities (outermost),
        then the per-queue activity figures of `ActivityFigures`."""
        return [TracingInterceptor(self.tracer), ActivityFigures()]

    def flush(self) -> None:
        """Export pending spans and a metric snapshot now."""
        self.tracer_provider.force_flush()
        self.meter_provider.force_flush()

    def shutdown(self) -> None:
        """Flush and stop exporters, the Prometheus server and the module-level instruments."""
        global _instruments, _tracer
        with _lock:
            if _instruments is not None and _tracer is self.tracer:
                _instruments, _tracer = None, trace.NoOpTracer()
        # each on a thread of its own (neither takes a deadline for all it does), side by side:
        # a collector that does not answer holds them, not the worker's stop
        stopping = [
            threading.Thread(target=provider.shutdown, name="telemetry-shutdown", daemon=True)
            for provider in (self.tracer_provider, self.meter_provider)
        ]
        for thread in stopping:
            thread.start()
        deadline = time.monotonic() + SHUTDOWN_S
        for thread in stopping:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in stopping):
            log.warning("telemetry: exporters not flushed in %g s, left behind", SHUTDOWN_S)
        if self._prometheus_server is not None:
            self._prometheus_server.shutdown()
            self._prometheus_server.server_close()
            self._prometheus_server = None
        if self._jsonl is not None:
            self._jsonl.close()


def setup_telemetry(
    settings: Settings, service: str, export_interval_s: float | None = None
) -> Telemetry:
    """Providers for `service` (a queue name or e.g. "cli"); makes the helpers below live.
    `export_interval_s`: between metric snapshots (None: `infra.telemetry_export`'s choice).
    ValueError for an OTLP endpoint that is no http(s) URL."""
    global _instruments, _tracer
    export = export_config(settings, export_interval_s)
    resource_ = Resource.create({"service.name": f"tempered-{service}", "process.pid": os.getpid()})
    tracer_provider = TracerProvider(resource=resource_)
    jsonl: JsonlSink | None = None
    prometheus_server = None
    readers: list[MetricReader] = []
    if not export.disabled:  # the providers themselves hand out no-op tracers and meters then
        span_exporter, metric_exporter, jsonl = _exporters(settings, service, export)
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        readers.append(
            PeriodicExportingMetricReader(
                metric_exporter, export_interval_millis=export.interval_ms
            )
        )
        port = prometheus_port_for(settings, service)
        if port is not None:
            registry = CollectorRegistry()
            readers.append(PrometheusMetricReader(registry=registry))
            prometheus_server, _ = start_http_server(  # the bare address, IPv6 too
                port, settings.telemetry.prometheus_host, registry=registry
            )
    meter_provider = MeterProvider(resource=resource_, metric_readers=readers)
    telemetry = Telemetry(
        settings, service, tracer_provider, meter_provider, jsonl, prometheus_server, export
    )
    with _lock:
        _instruments, _tracer = Instruments(telemetry.meter), telemetry.tracer
    return telemetry


def _exporters(
    settings: Settings, service: str, export: Export
) -> tuple[SpanExporter, MetricExporter, JsonlSink | None]:
    """The span and metric exporters to the collector, or to the process's JSONL file (its
    sink returned too, for the caller to close)."""
    if export.endpoint:
        # the gRPC exporters cost ~0.06 s to import: only processes that use a collector pay
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        spans = OTLPSpanExporter(endpoint=export.endpoint, timeout=export.span_timeout_s)
        metrics = OTLPMetricExporter(endpoint=export.endpoint, timeout=export.metric_timeout_s)
        return spans, metrics, None
    started = psutil.Process().create_time()  # a file per process start, not per pid
    path = settings.home / "telemetry" / jsonl_name(service, os.getpid(), started)
    drop_predecessors(path)
    jsonl = JsonlSink(path)
    return JsonlSpanExporter(jsonl), JsonlMetricExporter(jsonl), jsonl


def read_live_figures(
    settings: Settings, max_age_s: float | None = LIVE_WINDOW_S
) -> dict[str, WorkerFigures]:
    """Per worker process (`<service>-<pid>`): activity attempts by queue (in flight, per
    second, failed, cancelled, last error), RSS, CPU, sandbox outcomes and p50, tokens/s, reward…
    Workers whose file has not changed for `max_age_s` (None: no limit) are left out."""
    return _read_figures(settings.home / "telemetry", max_age_s)


class ActivityFigures(temporalio.client.Interceptor, temporalio.worker.Interceptor):
    """Counts a worker's activity attempts by queue: in flight, finished by outcome (ok, error,
    cancelled, shutdown), when one last failed or was cancelled (not by a shutdown: its span is
    then an ERROR that says why); tags the attempt's span (the tracing one's) `tempered.queue`."""

    def intercept_activity(
        self, next: temporalio.worker.ActivityInboundInterceptor
    ) -> temporalio.worker.ActivityInboundInterceptor:
        return _CountedActivity(next)


class _CountedActivity(temporalio.worker.ActivityInboundInterceptor):
    async def execute_activity(self, input: temporalio.worker.ExecuteActivityInput) -> Any:
        queue = temporalio.activity.info().task_queue
        trace.get_current_span().set_attribute("tempered.queue", queue)
        if (m := _instruments) is None:
            return await super().execute_activity(input)
        attrs = {"queue": queue}
        m.activity_in_flight.add(1, attrs)
        outcome = "ok"
        try:
            return await super().execute_activity(input)
        except Exception:
            outcome = "error"
            m.activity_last_error.set(time.time(), attrs)
            raise
        except BaseException:  # cancelled: timed out, asked by its workflow, worker shutdown
            outcome = "shutdown" if (reason := _cancel_reason()) is None else "cancelled"
            if reason is not None:  # it did not end as it should: an error to see in status
                m.activity_last_error.set(time.time(), attrs)
                error = trace.Status(trace.StatusCode.ERROR, f"cancelled ({reason})")
                trace.get_current_span().set_status(error)
            raise
        finally:
            m.activity_in_flight.add(-1, attrs)
            m.activity_attempts.add(1, {**attrs, "outcome": outcome})


CANCEL_REASONS = {
    "timed_out": "timed out",
    "cancel_requested": "asked by its workflow",
    "not_found": "not found on the server: timed out, or its workflow ended",
    "paused": "paused",
    "reset": "reset",
}  # what an attempt's `ActivityCancellationDetails` say, in the order looked for


def _cancel_reason() -> str | None:
    """Why Temporal cancelled the attempt; None for its worker's shutdown (the attempt is redone
    elsewhere: nothing went wrong with it)."""
    details = temporalio.activity.cancellation_details()
    if details is not None and details.worker_shutdown:
        return None
    said = (text for flag, text in CANCEL_REASONS.items() if getattr(details, flag, False))
    return next(said, "no reason given")


# ---- spans and recording helpers (no-ops until setup_telemetry) ---------------------------


def span(name: str, **attrs: Any) -> AbstractContextManager[trace.Span]:
    """A span under the current context; attrs (task_id, sample, turn, policy_version,
    sandbox_backend, …) become `tempered.<key>` attributes, None values are left out."""
    attributes = {f"tempered.{k}": _attr(v) for k, v in attrs.items() if v is not None}
    return _tracer.start_as_current_span(name, attributes=attributes)


def _attr(value: Any) -> str | int | float | bool:
    return value if isinstance(value, str | int | float | bool) else str(value)


def record_sandbox_run(backend: str, status: str, duration_s: float) -> None:
    if (m := _instruments) is not None:
        attrs = {"backend": backend, "status": str(status)}
        m.sandbox_runs.add(1, attrs)
        m.sandbox_duration.record(duration_s, attrs)


def sandbox_in_flight(backend: str) -> AbstractContextManager[None]:
    """Counts a sandboxed run as in flight while the block runs."""
    return _in_flight(backend) if _instruments is not None else nullcontext()


@contextmanager
def _in_flight(backend: str) -> Iterator[None]:
    counter = _instruments.sandbox_in_flight if _instruments else None
    if counter is not None:
        counter.add(1, {"backend": backend})
    try:
        yield
    finally:
        if counter is not None:
            counter.add(-1, {"backend": backend})


def record_inference_row(new_tokens: int, seconds: float) -> None:
    """A sampled row: its tokens, and its rate over its `seconds` in the backend."""
    if (m := _instruments) is not None:
        m.tokens.add(new_tokens)
        if seconds > 0:
            m.tokens_per_second.record(new_tokens / seconds)


def record_queue_wait() -> float | None:
    """Inside an activity: record and return its attempt's schedule-to-start seconds."""
    info = temporalio.activity.info()
    wait = (info.started_time - info.current_attempt_scheduled_time).total_seconds()
    if (m := _instruments) is not None:
        m.queue_wait.record(
            max(wait, 0.0), {"activity": info.activity_type, "queue": info.task_queue}
        )
    return wait


def count_rewards(
    rewards: Sequence[float], solved: Sequence[bool], run_id: str | None = None
) -> None:
    """Count samples whose trajectories were written (their rewards, the solved ones) by
    `run_kind`, training or evaluation only: a run_id label would add a series per run and per
    evaluated version (`<run>-eval-vN`) for the worker's life. Call it once per sample, by the
    write that stored it: a retry counts nothing twice."""
    if not rewards or (m := _instruments) is None:
        return
    evaluation = run_id is not None and is_evaluation(run_id)
    attrs = {"run_kind": "evaluation" if evaluation else "training"}
    m.rollout_samples.add(len(rewards), attrs)
    m.rollout_solved.add(sum(solved), attrs)
    m.reward_positive.add(sum(r for r in rewards if r > 0), attrs)
    m.reward_negative.add(-sum(r for r in rewards if r < 0), attrs)


def note_rewards(
    rewards: Sequence[float], solved: Sequence[bool], run_id: str | None = None
) -> None:
    """Put the run id and a group's mean reward and solved share on the current span (the
    activity's): call it once, with the whole group, whatever was counted."""
    if not rewards:
        return
    trace.get_current_span().set_attributes(
        {
            "tempered.reward_mean": sum(rewards) / len(rewards),
            "tempered.pass_rate": sum(solved) / len(rewards),
        }
        | ({"tempered.run_id": run_id} if run_id else {})
    )


def record_staleness(versions_behind: int) -> None:
    if (m := _instruments) is not None:
        m.staleness.record(versions_behind)


def record_learner_step(seconds: float) -> None:
    if (m := _instruments) is not None:
        m.step_time.record(seconds)


def record_circuit_state(backend: str, state: str) -> None:
    """`state` is a `infra.circuit.CircuitState` value: closed, half_open or open."""
    if (m := _instruments) is not None:
        m.circuit_state.set(CIRCUIT_STATES[str(state)], {"backend": backend})
