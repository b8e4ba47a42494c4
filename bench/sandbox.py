"""Sandbox latency, throughput and CPU per run, per backend, against a bare `python3`.

    sudo .venv/bin/python bench/sandbox.py [--runs 30] [--rounds 3] [--concurrency 2]
                                           [--backends local,gvisor]

Two workloads: `print(1)`, and a HumanEval-style check (a program and `check(candidate)` with
20 asserts). Every round measures, back to back in this one process, the bare interpreter
(`/usr/bin/python3 -S -I -c ...`: no isolation, no limits, program and tests in one process)
and each backend (`get_backend`: the two-process verifier, warm pool as configured): the
median latency of sequential runs, the throughput with `--concurrency` runs in flight, and the
CPU time per run of everything this process started (a cpuacct cgroup around it: host,
zygotes, sandboxes; kernel threads such as network-namespace teardown are not in it). Ratios
are taken within a round, so the bare baseline shares the machine's load of that moment; the
median over rounds is printed with the load average and merged into bench/results.json under
"sandbox". Targets for the HumanEval-style check on 2 cores: latency <= 1.3x bare, throughput
>= 80% of bare. On a shared machine, compare ratios, not absolute times.

What the baseline is: bare execs a fresh interpreter for every run, so its latency, throughput
and CPU include Python's start-up (most of a `print(1)` run); the backend forks its processes
from zygotes whose interpreter is already up, and its warm pool starts pairs ahead of time,
which can take them off a sequential run's latency (throughput and CPU still pay). A ratio
under 1x or a throughput over 100% is start-up the sandbox skips, not isolation for free. Each
side runs once unmeasured first, and rounds alternate which side goes first (until 6 December
bare always went first). It refuses a busy machine (`common.require_idle`, and after each
measured side if other processes took the cores; `--allow-busy` measures anyway, marked
`busy: true`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import (  # noqa: E402
    add_busy_flag,
    idle_side,
    machine,
    merge_results,
    require_idle,
)

from contracts.sandbox import ExecStatus  # noqa: E402
from contracts.task import SandboxLimits  # noqa: E402
from infra.sandbox import SandboxBackend, get_backend  # noqa: E402
from infra.settings import Settings  # noqa: E402

HUMANEVAL = (
    "def add(a: int, b: int) -> int:\n    return a + b\n",
    "def check(candidate):\n"
    + "".join(f"    assert candidate({i}, {2 * i}) == {3 * i}\n" for i in range(20)),
    "add",
)
WORKLOADS = {"print": ("print(1)\n", "", None), "humaneval": HUMANEVAL}
LIMITS = SandboxLimits(timeout_s=30)
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
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


def checked(backend: SandboxBackend) -> Runner:
    async def run(program: str, tests: str, entry_point: str | None) -> None:
        result = await backend.run(program, tests, LIMITS, entry_point)
        if result.status != ExecStatus.PASSED:
            raise RuntimeError(f"{backend.name}: {result.status} {result.detail} {result.stderr}")

    return run


async def latency_ms(runner: Runner, workload: tuple[str, str, str | None], runs: int) -> float:
    times = []
    for _ in range(runs):
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


@contextlib.contextmanager
def cpu_meter() -> Iterator[Path | None]:
    """Put this process (and so all it starts) in its own cpuacct cgroup, if the host allows."""
    if not (CPUACCT / "cgroup.procs").exists() or os.geteuid() != 0:
        yield None
        return
    group = CPUACCT / f"tempered-bench-{os.getpid()}"
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))
    try:
        yield group / "cpuacct.usage"
    finally:
        (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))
        with contextlib.suppress(OSError):
            group.rmdir()


async def cpu_ms_per_run(
    runner: Runner, workload: tuple[str, str, str | None], runs: int, usage: Path | None
) -> float:
    if usage is None:
        return float("nan")
    before = int(usage.read_text())
    await throughput(runner, workload, runs, 2)
    await asyncio.sleep(0.3)  # let released sandboxes finish dying (their CPU counts too)
    return (int(usage.read_text()) - before) / 1e6 / runs


async def one_round(
    runner: Runner,
    workload: tuple[str, str, str | None],
    runs: int,
    concurrency: int,
    usage: Path | None,
    bare_first: bool,
) -> dict[str, float]:
    """Bare and the backend, back to back (`bare_first` or not): one row of absolute figures
    and ratios."""
    sides = {"bare": bare, "box": runner}
    figures: dict[str, tuple[float, float, float]] = {}
    for side in ("bare", "box") if bare_first else ("box", "bare"):
        await sides[side](*workload)  # warm-up: zygotes, pools, page cache
        with idle_side(side):
            figures[side] = (
                await latency_ms(sides[side], workload, runs),
                await throughput(sides[side], workload, runs, concurrency),
                await cpu_ms_per_run(sides[side], workload, runs, usage),
            )
    (bare_ms, bare_rps, bare_cpu), (box_ms, box_rps, box_cpu) = figures["bare"], figures["box"]
    return {
        "bare_latency_ms": bare_ms,
        "latency_ms": box_ms,
        "latency_ratio": box_ms / bare_ms,
        "bare_throughput_rps": bare_rps,
        "throughput_rps": box_rps,
        "throughput_fraction": box_rps / bare_rps,
        "bare_cpu_ms_per_run": bare_cpu,
        "cpu_ms_per_run": box_cpu,
        "load_average_1m": os.getloadavg()[0],
    }


async def measure(
    backends: list[str], runs: int, rounds: int, concurrency: int, usage: Path | None
) -> dict[str, Any]:
    settings = Settings()
    report: dict[str, Any] = {
        "runs": runs,
        "rounds": rounds,
        "concurrency": concurrency,
        "backends": {},
    }
    for name in backends:
        backend = get_backend(settings, name)
        n = runs if name == "local" else max(5, runs // 3)
        try:
            for label, workload in WORKLOADS.items():
                rows = [
                    await one_round(checked(backend), workload, n, concurrency, usage, i % 2 == 0)
                    for i in range(rounds)
                ]
                row = {key: round(statistics.median(r[key] for r in rows), 3) for key in rows[0]}
                report["backends"].setdefault(name, {})[label] = row
                print(
                    f"{name:7s} {label:9s} latency {row['latency_ms']:6.1f} ms vs bare "
                    f"{row['bare_latency_ms']:5.1f} = {row['latency_ratio']:.2f}x | throughput "
                    f"{row['throughput_rps']:5.1f}/s vs {row['bare_throughput_rps']:5.1f}/s = "
                    f"{100 * row['throughput_fraction']:.0f}% | CPU/run {row['cpu_ms_per_run']:.1f}"
                    f" ms vs {row['bare_cpu_ms_per_run']:.1f} ms | load {row['load_average_1m']:.2f}",
                    flush=True,
                )
        finally:
            await backend.close()
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--backends", default="local,gvisor")
    add_busy_flag(parser)
    args = parser.parse_args()
    require_idle(args.allow_busy)
    load_before = os.getloadavg()
    with cpu_meter() as usage:
        report = asyncio.run(
            measure(args.backends.split(","), args.runs, args.rounds, args.concurrency, usage)
        )
    report["machine"] = machine()
    report["load_average_before"] = [round(x, 2) for x in load_before]
    merge_results("sandbox", report)


if __name__ == "__main__":
    main()
