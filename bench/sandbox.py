"""Sandbox latency and throughput, per backend, against a bare `python3` subprocess.

    sudo .venv/bin/python bench/sandbox.py [--runs 30] [--backends local,gvisor] [--concurrency 2]

Two workloads: `print(1)` and a HumanEval-style program + `check(candidate)`. For each, the
median latency of back-to-back runs, of paced runs (0.2 s apart, so the local backend's warm
pool refills between them, as it does while the worker waits on generation), and the
throughput (runs/s) with `--concurrency` runs in flight are measured for the bare interpreter (`/usr/bin/python3 -S -I -c ...`, no isolation,
no limits) and each backend, in the same process and session, then printed as ratios and
merged into bench/results.json under "sandbox". Numbers on a shared machine are noisy: the
bare baseline is re-measured alongside every backend.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import machine, merge_results  # noqa: E402

from contracts.sandbox import ExecStatus  # noqa: E402
from contracts.task import SandboxLimits  # noqa: E402
from infra.sandbox import get_backend  # noqa: E402
from infra.settings import Settings  # noqa: E402

HUMANEVAL = (
    "def add(a: int, b: int) -> int:\n    return a + b\n",
    "def check(candidate):\n"
    + "".join(f"    assert candidate({i}, {2 * i}) == {3 * i}\n" for i in range(20)),
    "add",
)
WORKLOADS = {"print": ("print(1)\n", "", None), "humaneval": HUMANEVAL}
PAUSE_S = 0.2
"""Gap between paced runs: the sandbox worker's real load is bursty (it waits on generation)."""
Runner = Callable[[str, str, str | None], Awaitable[None]]


async def bare(program: str, tests: str, entry_point: str | None) -> None:
    source = program + "\n" + tests + (f"\ncheck({entry_point})\n" if entry_point else "")
    process = await asyncio.create_subprocess_exec(
        "/usr/bin/python3",
        "-S",
        "-I",
        "-c",
        source,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    await process.communicate()
    if process.returncode != 0:
        raise RuntimeError("bare python failed")


BACKENDS: dict[Runner, object] = {}


async def runner_close(runner: Runner) -> None:
    backend = BACKENDS.pop(runner, None)
    if backend is not None:
        await backend.close()  # type: ignore[attr-defined]


def sandboxed(name: str, settings: Settings) -> Runner:
    backend = get_backend(settings, name)
    limits = SandboxLimits(timeout_s=30)

    async def run(program: str, tests: str, entry_point: str | None) -> None:
        result = await backend.run(program, tests, limits, entry_point)
        if result.status != ExecStatus.PASSED:
            raise RuntimeError(f"{name}: {result.status} {result.stderr[-300:]}")

    BACKENDS[run] = backend
    return run


async def latency_ms(
    runner: Runner, workload: tuple[str, str, str | None], runs: int, pause_s: float = 0.0
) -> float:
    times = []
    for _ in range(runs):
        await asyncio.sleep(pause_s)
        started = time.perf_counter()
        await runner(*workload)
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def throughput(
    runner: Runner, workload: tuple[str, str, str | None], runs: int, concurrency: int
) -> float:
    queue = iter(range(runs))

    async def worker() -> None:
        for _ in queue:
            await runner(*workload)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return runs / (time.perf_counter() - started)


async def measure(backends: list[str], runs: int, concurrency: int) -> dict[str, object]:
    settings = Settings()
    report: dict[str, object] = {"runs": runs, "concurrency": concurrency, "backends": {}}
    for name in backends:
        runner = sandboxed(name, settings)
        n = runs if name == "local" else max(5, runs // 4)
        per_workload = {}
        for label, workload in WORKLOADS.items():
            await runner(*workload)  # warm-up (page cache, first cgroup)
            bare_ms, box_ms = (
                await latency_ms(bare, workload, n),
                await latency_ms(runner, workload, n),
            )
            bare_idle = await latency_ms(bare, workload, n, PAUSE_S)
            box_idle = await latency_ms(runner, workload, n, PAUSE_S)
            bare_rps = await throughput(bare, workload, n, concurrency)
            box_rps = await throughput(runner, workload, n, concurrency)
            per_workload[label] = {
                "bare_latency_ms": round(bare_ms, 2),
                "latency_ms": round(box_ms, 2),
                "latency_ratio": round(box_ms / bare_ms, 2),
                "bare_latency_paced_ms": round(bare_idle, 2),
                "latency_paced_ms": round(box_idle, 2),
                "latency_paced_ratio": round(box_idle / bare_idle, 2),
                "bare_throughput_rps": round(bare_rps, 2),
                "throughput_rps": round(box_rps, 2),
                "throughput_fraction": round(box_rps / bare_rps, 3),
            }
            row = per_workload[label]
            print(
                f"{name:7s} {label:10s} latency {box_ms:7.1f} ms vs bare {bare_ms:6.1f} ms "
                f"= {row['latency_ratio']:.2f}x (paced {box_idle:.1f} vs {bare_idle:.1f} = "
                f"{row['latency_paced_ratio']:.2f}x) | throughput {box_rps:6.1f}/s vs bare {bare_rps:6.1f}/s "
                f"= {100 * row['throughput_fraction']:.0f}%",
                flush=True,
            )
        report["backends"][name] = per_workload  # type: ignore[index]
        await runner_close(runner)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--backends", default="local,gvisor")
    args = parser.parse_args()
    report = asyncio.run(measure(args.backends.split(","), args.runs, args.concurrency))
    report["machine"] = machine()
    merge_results("sandbox", report)


if __name__ == "__main__":
    main()
