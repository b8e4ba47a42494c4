"""Helpers the benchmarks share: a private stack on free ports, in-process workers, results.json.

    with bench_stack(Path(tmp)) as settings:          # Temporal dev server (WAL sqlite) + SeaweedFS
        async with production_workers(settings, [Queue.INFERENCE, ...]) as (client, plans):
            ...                                        # the workers `tempered worker Q` would run
    merge_results("orchestration", report)            # bench/results.json, other keys kept
    pool = SandboxPool(settings, limits); pool.passed(codes, tasks)  # one TaskSpec per program
    add_busy_flag(parser); require_idle(args.allow_busy)   # refuse to start on a busy machine
    with idle_side("plain"): ...                           # refuse if others took the cores

The stack is `infra.stack.up` (what `tempered up` starts) under a throw-away home on free
127.0.0.1 ports, so a benchmark never touches a developer's stack on 7233/8233/8333.
`BENCH_RESULTS=FILE` sends every merge (and run_all's summary) to FILE instead of
bench/results.json: a trial run that must not replace the recorded figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from contracts.names import Queue  # noqa: E402
from contracts.sandbox import ExecStatus  # noqa: E402
from contracts.task import SandboxLimits, TaskSpec  # noqa: E402
from infra.settings import S3Settings, Settings, TemporalSettings  # noqa: E402

RESULTS = Path(os.environ.get("BENCH_RESULTS") or Path(__file__).resolve().parent / "results.json")
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S%z"


def merge_results(key: str, report: dict[str, Any], path: Path = RESULTS) -> None:
    """Store `report` under `key` in results.json, keeping every other benchmark's key, stamped
    with when it was stored (`measured_at`: run_all tells this run's figures from older ones)
    and what the idle checks saw (`busy`, `idle_checks`)."""
    existing = json.loads(path.read_text()) if path.exists() else {}
    existing[key] = {**report, **IDLE.record(), "measured_at": time.strftime(TIME_FORMAT)}
    path.write_text(json.dumps(existing, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path} [{key}]", flush=True)


def machine() -> dict[str, Any]:
    """What the numbers were measured on: cores and the 1/5/15-minute load averages."""
    return {
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "measured_at": time.strftime(TIME_FORMAT),
    }


def median_of(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` quantile (0 < q <= 1): the smallest value with at least q of the
    values at or below it, so p99 of 100 values is the 99th, not the largest (nan if none)."""
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)]) if ordered else float("nan")


IDLE_LIMIT = 0.5
"""A machine is busy above this many runnable threads per core that are not the bench's own."""


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has spent busy since boot (stolen time included:
    a shared host's other guests slow a measurement as much as this machine's processes)."""
    import psutil

    t = psutil.cpu_times()
    guest = getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)  # already in user/nice
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0) - guest)


def own_cpu_seconds() -> float:
    """CPU seconds of this process and all its descendants, live ones and those already reaped
    (each live process's own time plus its reaped children's), so sandboxes and subprocesses
    that came and went during a side still count as the bench's."""
    import psutil

    root = psutil.Process()
    return sum(with_reaped_cpu_seconds(proc) for proc in [root, *root.children(recursive=True)])


def with_reaped_cpu_seconds(proc: Any) -> float:
    """User + system CPU seconds of psutil process `proc` and of its children it has reaped
    (0 where it is gone): a process tree's CPU summed over its live processes counts the ones
    that came and went once each, through whichever live process reaped them."""
    import psutil

    with contextlib.suppress(psutil.Error):
        t = proc.cpu_times()
        return float(t.user + t.system + t.children_user + t.children_system)
    return 0.0


class IdleGuard:
    """Refuses to measure on a busy machine, or records that it did (`--allow-busy`).

    `require` reads the 1-minute load average per core before anything is measured. A side
    (`with guard.side("plain"): ...`) is judged by the other processes' CPU while it ran: the
    machine's busy CPU seconds less the bench's own (its process tree), per second and core.
    After a side the load average would count the bench itself (one busy side is ~1 per core
    on 2 cores), and before the next one it still holds the last side, so it is recorded
    beside each side but only judges the start. Above `limit` the bench stops (SystemExit)
    unless busy is allowed; then `record()` says `busy: true`.
    """

    def __init__(
        self,
        limit: float = IDLE_LIMIT,
        load: Callable[[], float] = lambda: os.getloadavg()[0],
        busy_s: Callable[[], float] = machine_busy_seconds,
        own_s: Callable[[], float] = own_cpu_seconds,
        clock: Callable[[], float] = time.monotonic,
        cpus: int | None = None,
    ) -> None:
        self.limit, self.load, self.busy_s, self.own_s, self.clock = (
            limit,
            load,
            busy_s,
            own_s,
            clock,
        )
        self.cpus = cpus or os.cpu_count() or 1
        self.required = False
        self.allow_busy = False
        self.busy = False
        self.checks: list[dict[str, Any]] = []

    def require(self, allow_busy: bool) -> None:
        """Refuse to start (unless `allow_busy`) when the load per core is over the limit."""
        self.required, self.allow_busy = True, allow_busy
        per_core = self.load() / self.cpus
        self._judge("start", per_core, {"load_per_core": round(per_core, 2)})

    @contextlib.contextmanager
    def side(self, name: str) -> Iterator[None]:
        """Judge the side run in the block by the other processes' CPU meanwhile (not judged
        when the block raises, nor before `require`)."""
        load_before = self.load() / self.cpus
        busy0, own0, began = self.busy_s(), self.own_s(), self.clock()
        yield
        seconds = self.clock() - began
        others = max(0.0, (self.busy_s() - busy0) - (self.own_s() - own0))
        per_core = others / seconds / self.cpus if seconds > 0 else 0.0
        reading = {
            "others_cpu_per_core": round(per_core, 2),
            "load_per_core_before": round(load_before, 2),
            "load_per_core_after": round(self.load() / self.cpus, 2),
            "s": round(seconds, 1),
        }
        if self.required:
            self._judge(name, per_core, reading)

    def _judge(self, when: str, per_core: float, reading: dict[str, Any]) -> None:
        busy = per_core > self.limit
        self.checks.append({"when": when, **reading, "busy": busy})
        if not busy:
            return
        what = "load" if when == "start" else "other processes' CPU"
        message = f"machine busy at {when}: {what} {per_core:.2f} per core > {self.limit}"
        if not self.allow_busy:
            raise SystemExit(f"{message}; not measured (--allow-busy measures anyway, marked)")
        self.busy = True
        print(f"WARNING: {message}; measuring anyway (--allow-busy): recorded busy: true")

    def record(self) -> dict[str, Any]:
        """What a report carries: `busy`, the limit and every check (nothing before `require`)."""
        if not self.required:
            return {}
        return {"busy": self.busy, "idle_limit_per_core": self.limit, "idle_checks": self.checks}


IDLE = IdleGuard()
"""This bench process's guard: `require_idle` at the start, `idle_side` around each side."""


def add_busy_flag(parser: Any) -> None:
    parser.add_argument(
        "--allow-busy",
        action="store_true",
        help=f"measure even above {IDLE_LIMIT} busy threads per core (recorded as busy: true)",
    )


def require_idle(allow_busy: bool) -> None:
    """Stop here unless the machine is idle enough to measure on (or `allow_busy`)."""
    IDLE.require(allow_busy)


def idle_side(name: str) -> contextlib.AbstractContextManager[None]:
    """`with idle_side("tempered"): ...`: stop after the block if others took the cores."""
    return IDLE.side(name)


def stack_settings(home: Path, **overrides: Any) -> Settings:
    """Settings of a private stack under `home`: Temporal and SeaweedFS on free ports."""
    from infra.processes import free_port
    from infra.seaweed import pick_free_ports

    s3_port, base_port = pick_free_ports()
    return Settings(
        home=home,
        temporal=TemporalSettings(
            address=f"127.0.0.1:{free_port()}",
            ui_port=free_port(),
            http_port=free_port(),
            codec_port=free_port(),
        ),
        s3=S3Settings(endpoint=f"http://127.0.0.1:{s3_port}", embedded_base_port=base_port),
        **overrides,
    )


@contextlib.contextmanager
def bench_stack(home: Path, **overrides: Any) -> Iterator[Settings]:
    """`tempered up` under `home` on free ports for the `with` block, `tempered down` after."""
    from infra import stack

    settings = stack_settings(home, **overrides)
    try:
        stack.up(settings, say=lambda line: print(f"  {line}", flush=True))
        yield settings
    finally:
        stack.down(settings)


def temporal_pid(settings: Settings) -> int:
    from infra.stack import temporal_service

    pid = temporal_service(settings).pid()
    if pid is None:
        raise RuntimeError("the bench's Temporal dev server is not running")
    return pid


def cpu_seconds(pid: int | None = None, children: bool = True, exclude: int | None = None) -> float:
    """User + system CPU seconds so far of `pid` (default: this process), and its live children
    but `exclude` and its own (e.g. the dev server, where `tempered up` started it from here)."""
    import psutil

    process = psutil.Process(pid)
    skipped: set[int] = set()
    if exclude is not None:
        with contextlib.suppress(psutil.Error):
            skipped = {exclude, *(p.pid for p in psutil.Process(exclude).children(recursive=True))}
    total = 0.0
    for proc in [process, *(process.children(recursive=True) if children else [])]:
        if proc.pid in skipped:
            continue
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            total += times.user + times.system
    return total


@contextlib.asynccontextmanager
async def production_workers(
    settings: Settings, queues: Sequence[Queue]
) -> AsyncIterator[tuple[Any, dict[Queue, Any]]]:
    """In this process, the workers of `queues` exactly as `tempered worker` builds them.

    Yields (client, {queue: WorkerPlan}); each plan's `activities` are the bound methods the
    worker serves, so a baseline can call the very same objects without Temporal.
    """
    from workers.runtime import build_worker, connect

    client = await connect(settings)
    built = {queue: await build_worker(client, queue, settings) for queue in queues}
    async with contextlib.AsyncExitStack() as stack:
        for worker, plan in built.values():
            if plan.on_shutdown is not None:  # exits run last-in first-out: worker stops first
                stack.push_async_callback(plan.on_shutdown)
            await stack.enter_async_context(worker)
        yield client, {queue: plan for queue, (_, plan) in built.items()}


def activity_method(plans: dict[Queue, Any], queue: Queue, name: str) -> Callable[..., Any]:
    """The bound activity method `name` served by the worker of `queue`."""
    for method in plans[queue].activities:
        if getattr(method, "__name__", None) == name:
            return method  # type: ignore[no-any-return]
    raise KeyError(f"worker {queue.value} serves no activity method {name!r}")


class Stopwatch:
    """`with Stopwatch() as sw: ...` then `sw.seconds`."""

    def __enter__(self) -> Stopwatch:
        self.started = time.perf_counter()
        self.seconds = 0.0
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.started


class SandboxPool:
    """The configured sandbox backend on an event loop of its own thread, for synchronous callers
    (e.g. a TRL reward function): `passed(...)` runs programs concurrently and blocks until done.
    """

    def __init__(self, settings: Settings, limits: SandboxLimits) -> None:
        from infra.sandbox import get_backend

        self.limits = limits
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name="sandbox").start()

        async def build() -> tuple[Any, asyncio.Semaphore]:  # loop-bound objects, made in it
            return get_backend(settings), asyncio.Semaphore(settings.sandbox.concurrency)

        self.backend, self.slots = self._call(build())

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def passed(self, codes: list[str], tasks: list[TaskSpec]) -> list[bool]:
        """Whether each program passes its task's tests, all run concurrently."""

        async def one(code: str, task: TaskSpec) -> bool:
            async with self.slots:
                result = await self.backend.run(
                    code, task.tests, self.limits, task.entry_point, task.helpers, task.hidden_tests
                )
            return bool(result.status == ExecStatus.PASSED)

        async def every() -> list[bool]:
            return await asyncio.gather(*(one(c, t) for c, t in zip(codes, tasks, strict=True)))

        return list(self._call(every()))

    def close(self) -> None:
        self._call(self.backend.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
