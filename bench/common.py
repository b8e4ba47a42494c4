"""Helpers the benchmarks share: a private stack on free ports, in-process workers, results.json.

    with bench_stack(Path(tmp)) as settings:          # Temporal dev server (WAL sqlite) + SeaweedFS
        async with production_workers(settings, [Queue.INFERENCE, ...]) as (client, plans):
            ...                                        # the workers `tempered worker Q` would run
    merge_results("orchestration", report)            # bench/results.json, other keys kept
    pool = SandboxPool(settings, limits); pool.passed(codes, tasks)  # one TaskSpec per program

The stack is `infra.stack.up` (what `tempered up` starts) under a throw-away home on free
127.0.0.1 ports, so a benchmark never touches a developer's stack on 7233/8233/8333.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
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

RESULTS = Path(__file__).resolve().parent / "results.json"


def merge_results(key: str, report: dict[str, Any], path: Path = RESULTS) -> None:
    """Store `report` under `key` in results.json, keeping every other benchmark's key."""
    existing = json.loads(path.read_text()) if path.exists() else {}
    existing[key] = report
    path.write_text(json.dumps(existing, indent=2, sort_keys=True) + "\n")
    print(f"wrote {path} [{key}]", flush=True)


def machine() -> dict[str, Any]:
    """What the numbers were measured on: cores and the 1/5/15-minute load averages."""
    return {
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def median_of(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


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
        for line in stack.up(settings):
            print(f"  {line}", flush=True)
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
