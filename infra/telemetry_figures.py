"""The reader behind `tempered status`: live figures of each worker from its JSONL telemetry.

    figures = read_live_figures(settings.home / "telemetry")   # {"<service>-<pid>": WorkerFigures}
    worker = worker_figures(service, pid, alive, records)       # one file's tail records

The files are the ones `infra/telemetry_files.py` writes (one per worker process, rotated by
size). Metric records are cumulative snapshots, so the newest one is the worker's current state;
`read_live_figures` reads each file backwards (continuing into its `.1` after a rotation) until
it has the newest snapshots, however many spans came since (`LOOK_BACK_BYTES` at most), and
turns them into a `WorkerFigures`: per task queue the activity attempts in flight, finished per
second, failed, cancelled, and the newest failure's message (from the failed spans read), RSS,
CPU, sandbox outcomes and p50 latency, tokens/s, and the mean reward and solved share of the
training samples written lately. Rates and means come from counters' growth
between snapshots; a counter that went back (a process's counts read after another's) gives
none. Of two files of one `<service>-<pid>` (a container restarted keeps its pid) the later
process start's is the worker. Most callers go through `infra.telemetry.read_live_figures`.

A worker is `live` while its process runs (not a zombie: an exited worker not yet reaped still
answers `kill -0`; and the process of its file's start, not a later one of the same pid) and its
newest snapshot is not `stale`: older than STALE_INTERVALS of its own export intervals (each
snapshot's `interval_s`, or the gaps between the newest ones), STALE_S at least. A worker that
is not live shows no rates (None), only its counts and its last error.

Not covered: writing the files (`infra/telemetry_files.py`), and an OTLP collector's figures
(with a collector there are no files: the same figures are in its metrics and traces).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import psutil
from pydantic import BaseModel, Field, computed_field

from infra.telemetry_files import parse_jsonl_name, rotated_path
from infra.telemetry_instruments import histogram_quantile

TAIL_BYTES = 512 * 1024
"""How much of each file's end `read_live_figures` reads at least (for failed spans)."""
LOOK_BACK_BYTES = 32 * 2**20
"""How far back (file and rotated part together) it looks for the newest snapshots: spans
share the file, a busy worker writes over 1 MB of them between two (160 spans/s at the 10 s
interval: ~0.6 MB); further back than this its figures are not read (none shown)."""
CHUNK_BYTES = 512 * 1024
"""How much is read at a time, backwards from a file's end."""
LIVE_WINDOW_S = 900.0
"""Files not written for this long (a worker gone for 15 minutes) are left out by default."""
RATE_WINDOW_S = 1.0
"""Rates (tokens/s) are taken between snapshots at least this far apart when possible."""
STALE_S = 60.0
"""A worker whose newest snapshot is older than this is stale, however long its interval."""
STALE_INTERVALS = 6
"""...or older than this many of its own export intervals, where that is longer."""
START_SLACK_S = 1.0
"""A process is the one of a file when their start times are this close (the name has ms)."""


class QueueFigures(BaseModel):
    """Activity attempts one worker process ran for one task queue."""

    in_flight: int = Field(default=0, description="Attempts executing now.")
    succeeded: int = Field(default=0, description="Attempts that returned, since the start.")
    failed: int = Field(default=0, description="Attempts that raised, since the start.")
    cancelled: int = Field(
        default=0,
        description="Attempts cancelled (a heartbeat or other timeout, a cancel their workflow "
        "asked for), since the start; a worker shutdown's are not counted.",
    )
    per_s: float | None = Field(
        default=None,
        description="Attempts that returned or raised per second lately (cancelled ones not).",
    )
    last_error_at: float | None = Field(
        default=None, description="Unix time of the last failure or cancel."
    )
    last_error: str | None = Field(
        default=None, description="'activity: Type: message' or 'activity: cancelled (why)'."
    )


class WorkerFigures(BaseModel):
    """What `tempered status` shows of one worker process (one `infra.telemetry_files` file)."""

    service: str = Field(description="The queues it serves, joined by '+'.")
    pid: int
    alive: bool = Field(description="Whether the process still runs (not exited nor a zombie).")
    age_s: float = Field(description="Seconds since its newest metric snapshot.")
    stale: bool = Field(
        default=False, description="Its newest snapshot is older than stale_after_s."
    )
    stale_after_s: float = Field(
        default=STALE_S,
        description=f"{STALE_INTERVALS} of its export intervals, {STALE_S:g} s at least.",
    )
    queues: dict[str, QueueFigures] = Field(default={}, description="By task queue.")
    rss_mb: float | None = None
    rss_peak_mb: float | None = None
    cpu_percent: float | None = None
    sandbox_runs: dict[str, int] = Field(default={}, description="Sandboxed runs by status.")
    sandbox_runs_per_s: float | None = None
    sandbox_in_flight: int = 0
    sandbox_p50_s: float | None = None
    tokens_per_s: float | None = None
    reward_mean: float | None = Field(
        default=None,
        description="Mean reward of the training samples written since the oldest snapshot read "
        "(SNAPSHOTS_KEPT of them, about 30 s; since the start where there is one); None: none.",
    )
    pass_rate: float | None = Field(
        default=None, description="The share of those samples that solved their task."
    )
    learner_steps: int = Field(default=0, description="Learner steps it published.")
    learner_step_mean_s: float | None = Field(
        default=None, description="Their mean time, each from its activity's start to publish."
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def live(self) -> bool:
        """Alive and not stale; a worker that is not shows no rates."""
        return self.alive and not self.stale

    @property
    def queue_names(self) -> list[str]:
        return self.service.split("+")


SNAPSHOTS_KEPT = 4
"""Newest metric snapshots read per file: the current state and a few to take rates against."""


def _lines_back(handle: BinaryIO, budget: list[int]) -> Iterator[bytes]:
    """The lines of an open file, newest first, read backwards CHUNK_BYTES at a time while
    `budget[0]` (bytes, shared by the caller's files) lasts; the oldest line read whole only
    when the file's start was reached (a line cut by the budget is not given)."""
    position = handle.seek(0, os.SEEK_END)
    carried = b""
    while position > 0 and budget[0] > 0:
        size = min(CHUNK_BYTES, position, budget[0])
        position -= size
        budget[0] -= size
        handle.seek(position)
        lines = (handle.read(size) + carried).split(b"\n")
        carried = lines[0]  # may begin before this chunk: joined with the next one back
        yield from reversed(lines[1:])
    if position == 0:
        yield carried


def _tail_records(path: Path) -> list[dict[str, Any]]:
    """The newest SNAPSHOTS_KEPT metric snapshots of `path` and, before them, of its rotated
    part (just after a rotation the new file may hold no snapshot yet), however many spans
    came after them up to LOOK_BACK_BYTES back, and every failed span in what was read (the
    final TAIL_BYTES at least); oldest first (other lines not parsed)."""
    found: list[dict[str, Any]] = []
    snapshots, budget = 0, [LOOK_BACK_BYTES]
    handles = []
    try:  # both opened first: a rotation meanwhile renames the file open, no line read twice
        for part in (path, rotated_path(path)):
            with contextlib.suppress(FileNotFoundError):
                handles.append(part.open("rb"))
        if len({os.fstat(h.fileno()).st_ino for h in handles}) < len(handles):
            handles = handles[:1]  # rotated between the two opens: the first is that part
        for handle in handles:
            for line in _lines_back(handle, budget):
                if snapshots >= SNAPSHOTS_KEPT and LOOK_BACK_BYTES - budget[0] >= TAIL_BYTES:
                    return found[::-1]
                wanted = b'"ERROR"' in line or (b'"metrics"' in line and snapshots < SNAPSHOTS_KEPT)
                if not wanted:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a write in progress
                if isinstance(record, dict):
                    found.append(record)
                    snapshots += record.get("kind") == "metrics"
    finally:
        for handle in handles:
            handle.close()
    return found[::-1]


def _points(record: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [p for p in record.get("points", []) if p.get("name") == name]


def _total(record: dict[str, Any], name: str, **attrs: str) -> float:
    points = _points(record, name)
    return float(sum(p.get("value", 0) for p in points if attrs.items() <= p["attrs"].items()))


def _merged_histogram(record: dict[str, Any], name: str) -> tuple[list[float], list[int], float]:
    bounds: list[float] = []
    buckets: list[int] = []
    total = 0.0
    for point in _points(record, name):
        if not buckets:
            bounds, buckets = list(point["bounds"]), [0] * len(point["buckets"])
        if list(point["bounds"]) == bounds:
            buckets = [a + b for a, b in zip(buckets, point["buckets"], strict=True)]
            total += point.get("sum", 0.0)
    return bounds, buckets, total


def _gauge(record: dict[str, Any], name: str, **attrs: str) -> float | None:
    """The value of gauge `name` whose labels include `attrs`. Point times are the snapshot's,
    not the writes', and points come in label-set creation order: labels tell them apart."""
    points = [p for p in _points(record, name) if attrs.items() <= p["attrs"].items()]
    return float(points[-1]["value"]) if points else None


class _Snapshots:
    """The newest metric snapshot of a worker, the one to take rates against, and the oldest."""

    def __init__(self, snapshots: list[dict[str, Any]]) -> None:
        self.latest = snapshots[-1]
        # the newest snapshot at least RATE_WINDOW_S older (a shutdown snapshot often follows a
        # periodic one within milliseconds), else the oldest one kept; none if only one
        older = [r for r in snapshots[:-1] if self.latest["ts"] - r["ts"] >= RATE_WINDOW_S]
        self.previous = older[-1] if older else (snapshots[0] if len(snapshots) > 1 else None)
        self.oldest = snapshots[0] if len(snapshots) > 1 else None

    def rate(self, name: str, **attrs: str) -> float | None:
        """Per-second growth of counter `name` (points matching `attrs`) between the two."""
        if self.previous is None or self.latest["ts"] <= self.previous["ts"]:
            return None
        grown = self.growth(self.previous, name, **attrs)
        if grown is None:
            return None
        return round(grown / (self.latest["ts"] - self.previous["ts"]), 2)

    def growth(self, since: dict[str, Any] | None, name: str, **attrs: str) -> float | None:
        """How much counter `name` grew from snapshot `since` (None: the process's start) to the
        latest; None where it went back: counts of another process, not a negative rate."""
        grown = _total(self.latest, name, **attrs) - (
            _total(since, name, **attrs) if since else 0.0
        )
        return None if grown < 0 else grown


def _queue_figures(
    snapshots: _Snapshots, failures: list[dict[str, Any]], live: bool
) -> dict[str, QueueFigures]:
    latest = snapshots.latest
    queues: dict[str, QueueFigures] = {}
    for name in ("tempered.activity.attempts", "tempered.activity.in_flight"):
        for point in _points(latest, name):
            queues.setdefault(str(point["attrs"].get("queue", "?")), QueueFigures())
    for queue, figures in queues.items():
        figures.in_flight = int(_total(latest, "tempered.activity.in_flight", queue=queue))
        attempts = "tempered.activity.attempts"
        figures.succeeded = int(_total(latest, attempts, queue=queue, outcome="ok"))
        figures.failed = int(_total(latest, attempts, queue=queue, outcome="error"))
        figures.cancelled = int(_total(latest, attempts, queue=queue, outcome="cancelled"))
        finished = [snapshots.rate(attempts, queue=queue, outcome=o) for o in ("ok", "error")]
        done = None if None in finished else sum(r for r in finished if r is not None)
        figures.per_s = round(done, 2) if live and done is not None else None
        times = [
            p["value"]
            for p in _points(latest, "tempered.activity.last_error_time")
            if p["attrs"].get("queue") == queue
        ]
        figures.last_error_at = max(times) if times else None
        mine = [s for s in failures if s.get("attrs", {}).get("tempered.queue") == queue]
        if mine:
            newest = mine[-1]
            activity = str(newest["name"]).removeprefix("RunActivity:")
            figures.last_error = f"{activity}: {newest.get('error') or 'failed'}"
    return queues


def _training_rewards(snapshots: _Snapshots) -> tuple[float | None, float | None]:
    """(mean reward, solved share) of the training samples counted since the oldest snapshot
    (the process's start where there is one); None, None where none were."""
    training = {"run_kind": "training"}
    since = snapshots.oldest
    samples = snapshots.growth(since, "tempered.rollout.samples", **training)
    solved = snapshots.growth(since, "tempered.rollout.solved", **training)
    above = snapshots.growth(since, "tempered.reward.positive", **training)
    below = snapshots.growth(since, "tempered.reward.negative", **training)
    if not samples or solved is None or above is None or below is None:
        return None, None
    return round((above - below) / samples, 4), round(solved / samples, 4)


def _stale_after_s(metrics: list[dict[str, Any]]) -> float:
    """STALE_INTERVALS of the worker's export interval (the longest of the intervals its
    snapshots record and the gaps between them: files of earlier releases record none), and
    STALE_S at least."""
    intervals = [float(r["interval_s"]) for r in metrics if r.get("interval_s") is not None]
    intervals += [b["ts"] - a["ts"] for a, b in zip(metrics, metrics[1:], strict=False)]
    return max(STALE_S, STALE_INTERVALS * max(intervals, default=0.0))


def worker_figures(
    service: str, pid: int, alive: bool, records: list[dict[str, Any]]
) -> WorkerFigures | None:
    """Figures of one worker from its file's tail records (oldest first); None without metrics.
    `alive`: whether its process runs (`process_alive`)."""
    metrics = [r for r in records if r.get("kind") == "metrics"][-SNAPSHOTS_KEPT:]
    if not metrics:
        return None
    failures = [r for r in records if r.get("kind") == "span" and r.get("status") == "ERROR"]
    snapshots = _Snapshots(metrics)
    latest = snapshots.latest
    runs: dict[str, int] = {}
    for point in _points(latest, "tempered.sandbox.runs"):
        status = str(point["attrs"].get("status", "?"))
        runs[status] = runs.get(status, 0) + int(point["value"])
    bounds, buckets, _ = _merged_histogram(latest, "tempered.sandbox.duration")
    p50 = histogram_quantile(bounds, buckets, 0.5)
    _, step_buckets, step_sum = _merged_histogram(latest, "tempered.learner.step_time")
    steps = sum(step_buckets)
    age_s = max(time.time() - latest["ts"], 0.0)
    stale_after_s = _stale_after_s(metrics)
    stale = age_s > stale_after_s
    live = alive and not stale
    rss = _gauge(latest, "tempered.process.rss")
    rss_peak = _gauge(latest, "tempered.process.rss_peak")
    reward_mean, pass_rate = _training_rewards(snapshots)
    return WorkerFigures(
        service=service,
        pid=pid,
        alive=alive,
        age_s=round(age_s, 1),
        stale=stale,
        stale_after_s=stale_after_s,
        queues=_queue_figures(snapshots, failures, live),
        rss_mb=None if rss is None else round(rss / 2**20, 1),
        rss_peak_mb=None if rss_peak is None else round(rss_peak / 2**20, 1),
        cpu_percent=_gauge(latest, "tempered.process.cpu_percent") if live else None,
        sandbox_runs=runs,
        sandbox_runs_per_s=snapshots.rate("tempered.sandbox.runs") if live else None,
        sandbox_in_flight=int(_total(latest, "tempered.sandbox.in_flight")),
        sandbox_p50_s=None if p50 is None else round(p50, 4),
        tokens_per_s=snapshots.rate("tempered.inference.tokens") if live else None,
        reward_mean=reward_mean,
        pass_rate=pass_rate,
        learner_steps=steps,
        learner_step_mean_s=round(step_sum / steps, 4) if steps else None,
    )


def read_live_figures(
    telemetry_dir: Path, max_age_s: float | None = LIVE_WINDOW_S
) -> dict[str, WorkerFigures]:
    """`{"<service>-<pid>": figures}` for every JSONL file under `telemetry_dir` (of a pid's
    files, the latest process start's).

    Files of processes that are gone are still reported (with `alive=False`) unless older
    than `max_age_s`, so a crashed worker's last state and error stay visible.
    """
    workers: dict[str, WorkerFigures] = {}
    if not telemetry_dir.is_dir():
        return workers
    now = time.time()
    files: dict[str, tuple[int, Path]] = {}  # per `<service>-<pid>`: its latest start's file
    for path in telemetry_dir.glob("*-*.jsonl"):
        name = parse_jsonl_name(path.stem)
        if name is not None:
            key = f"{name[0]}-{name[1]}"
            if key not in files or name[2] > files[key][0]:
                files[key] = (name[2], path)
    for key, (started_ms, path) in sorted(files.items()):
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            continue  # renamed by a rotation since the glob: the next look finds it
        if max_age_s is not None and now - mtime > max_age_s:
            continue
        service, _, pid_text = key.rpartition("-")
        pid = int(pid_text)
        alive = process_alive(pid, started_ms / 1000)
        figures = worker_figures(service, pid, alive, _tail_records(path))
        if figures is not None:
            workers[key] = figures
    return workers


def process_alive(pid: int, started: float) -> bool:
    """Whether process `pid` that started at Unix time `started` (0: unknown, a file of an
    earlier release) still runs: not gone, not a zombie (exited, not reaped yet), and not
    another process that took the pid since (its start is not the file's)."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        return not started or abs(process.create_time() - started) <= START_SLACK_S
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
