"""The catalogue of Tempered's OpenTelemetry instruments: names, units, buckets, meanings.

`Instruments(meter)` creates every histogram, counter and gauge the workers record onto, plus
observable gauges of the process's RSS, peak RSS and CPU. `infra/telemetry.py` creates one per
process in `setup_telemetry` and records through its `record_*` helpers; nothing else should
create instruments, so each metric is named and described here only. The JSONL reader
(`infra/telemetry_figures.py`) looks figures up by these names and reads histograms back with
`histogram_quantile`; Prometheus spells them with underscores (`tempered_sandbox_runs_total`).
Labels take few values each (no run ids): every label set is a series for the process's life.
"""

from __future__ import annotations

import resource
from collections.abc import Sequence

import psutil
from opentelemetry.metrics import CallbackOptions, Meter, Observation

SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
"""Histogram bucket bounds of durations: 5 ms to 15 minutes."""
CIRCUIT_STATES = {"closed": 0, "half_open": 1, "open": 2}
"""The value `tempered.circuit.state` records for each `infra.circuit.CircuitState`."""


class Instruments:
    """Every instrument Tempered records, created on one meter."""

    def __init__(self, meter: Meter) -> None:
        histogram, seconds = meter.create_histogram, list(SECONDS_BUCKETS)
        self.sandbox_duration = histogram(
            "tempered.sandbox.duration",
            "s",
            "Wall time of one sandboxed run.",
            explicit_bucket_boundaries_advisory=seconds,
        )
        self.sandbox_runs = meter.create_counter(
            "tempered.sandbox.runs", "{run}", "Sandboxed runs by status and backend."
        )
        self.sandbox_in_flight = meter.create_up_down_counter(
            "tempered.sandbox.in_flight", "{run}", "Sandboxed runs executing now."
        )
        self.tokens = meter.create_counter(
            "tempered.inference.tokens", "{token}", "Generated tokens."
        )
        self.tokens_per_second = histogram(
            "tempered.inference.tokens_per_second",
            "{token}/s",
            "Throughput of one generate call.",
            explicit_bucket_boundaries_advisory=[10, 50, 100, 250, 500, 1000, 2500, 5000, 10000],
        )
        self.activity_in_flight = meter.create_up_down_counter(
            "tempered.activity.in_flight", "{attempt}", "Activity attempts executing now, by queue."
        )
        self.activity_attempts = meter.create_counter(
            "tempered.activity.attempts",
            "{attempt}",
            "Finished activity attempts by queue and outcome (ok, error, cancelled, shutdown).",
        )
        self.activity_last_error = meter.create_gauge(
            "tempered.activity.last_error_time",
            "s",
            "Unix time of a queue's newest failed attempt.",
        )
        self.queue_wait = histogram(
            "tempered.activity.queue_wait",
            "s",
            "Schedule-to-start latency of activity attempts.",
            explicit_bucket_boundaries_advisory=seconds,
        )
        # counters, not gauges of a group's mean: a mean over any window is the ratio of their
        # growth, e.g. (rate(positive) - rate(negative)) / rate(samples); a reward may be below
        # 0 (RewardConfig.failed_turn), which a counter cannot add, hence two sums
        self.rollout_samples = meter.create_counter(
            "tempered.rollout.samples",
            "{sample}",
            "Samples whose trajectory was written, by run_kind (training, evaluation).",
        )
        self.rollout_solved = meter.create_counter(
            "tempered.rollout.solved", "{sample}", "Of those samples, the solved ones, by run_kind."
        )
        self.reward_positive = meter.create_counter(
            "tempered.reward.positive", "1", "Sum of those samples' rewards above 0, by run_kind."
        )
        self.reward_negative = meter.create_counter(
            "tempered.reward.negative",
            "1",
            "Sum of the magnitudes of those samples' rewards below 0, by run_kind.",
        )
        self.staleness = histogram(
            "tempered.policy.staleness",
            "{version}",
            "Policy versions behind the learner.",
            explicit_bucket_boundaries_advisory=[0, 1, 2, 3, 4, 8, 16],
        )
        self.step_time = histogram(
            "tempered.learner.step_time",
            "s",
            "Wall time of one train step.",
            explicit_bucket_boundaries_advisory=seconds,
        )
        self.circuit_state = meter.create_gauge(
            "tempered.circuit.state", "1", "Sandbox backend breaker: 0 closed, 1 half-open, 2 open."
        )
        process = psutil.Process()
        process.cpu_percent(None)  # primes the counter; the first reading is otherwise 0

        def rss(_: CallbackOptions) -> list[Observation]:
            return [Observation(process.memory_info().rss)]

        def rss_peak(_: CallbackOptions) -> list[Observation]:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
            return [Observation(max(peak, process.memory_info().rss))]

        def cpu(_: CallbackOptions) -> list[Observation]:
            return [Observation(process.cpu_percent(None))]

        meter.create_observable_gauge("tempered.process.rss", [rss], "By", "Resident set size.")
        meter.create_observable_gauge("tempered.process.rss_peak", [rss_peak], "By", "Peak RSS.")
        meter.create_observable_gauge("tempered.process.cpu_percent", [cpu], "%", "CPU use.")


def histogram_quantile(bounds: Sequence[float], buckets: Sequence[int], q: float) -> float | None:
    """Quantile `q` of an explicit-bucket histogram, interpolated linearly inside its bucket."""
    total = sum(buckets)
    if total == 0:
        return None
    rank, seen = q * total, 0
    for index, count in enumerate(buckets):
        if count and seen + count >= rank:
            low = bounds[index - 1] if index > 0 else 0.0
            high = bounds[index] if index < len(bounds) else (bounds[-1] if bounds else 0.0)
            return low + (high - low) * ((rank - seen) / count)
        seen += count
    return bounds[-1] if bounds else None
