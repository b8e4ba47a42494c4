"""A memory peak near the limit is no OOM kill: only an OOM kill at the limit is the limit's.

`Cgroups.memory_event` said "limit" whenever the group's peak usage had come within
`LIMIT_SLACK` of its limit, a high-water mark of the whole run, and the judge read that first:
on bwrap a program that touched 60 of its 64 MB, freed them, and spun to its CPU limit was
memory_exceeded (gVisor: timeout), and a SIGKILL from outside its sandbox (a platform fault,
retried) after such a peak was scored as the program's memory_exceeded. Now "limit" needs an
OOM kill in the run's groups (cgroup v1 counts one in its victim's own group only: summed over
the groups below, where runsc's sandbox group is); where the kernel counts none, "reached",
which only a SIGKILL of the program makes memory_exceeded. Real cgroups and bwrap runs here
(root); the kernel without an `oom_kill` count is stood for by plain files.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.cgroups import LIMIT_SLACK, MB, Cgroups
from infra.sandbox.judge import Exit, Observed, judge
from infra.sandbox.process import Capture
from tests.infra.sandbox.test_infra_faults import INFRA, mark, memory_cgroup_of, strike
from tests.infra.sandbox.verifier_box import needs_root

# -- the kernel's own accounting, read by `memory_event` --------------------------------------

FILL = """
import sys, time
from pathlib import Path
group = Path(sys.argv[1])
limit = int((group / "memory.limit_in_bytes").read_text())
blocks = []
while int((group / "memory.usage_in_bytes").read_text()) < limit - (LIMIT_SLACK // 2):
    blocks.append(bytearray(1 << 20))
    blocks[-1][::4096] = b"x" * 256
del blocks
"""
"""Touch memory 1 MB at a time until the group's usage is within half `LIMIT_SLACK` of its
limit (the group is argv[1]), free it, and exit 0: never over the limit, so no OOM kill."""
HOG = "blocks = [bytearray(1 << 20) for _ in range(200)]\nfor b in blocks:\n    b[::4096] = b'x' * 256\n"


@pytest.fixture
def run_group() -> Iterator[Cgroups]:
    """A real run's groups, limited to 64 MB, their memory group's `sandbox` group removed after."""
    if not Cgroups.prepare():
        pytest.skip("needs root and writable cgroups v1 (memory, pids)")
    name = f"{os.getpid()}-fix60-{uuid.uuid4().hex[:8]}"
    cgroups = Cgroups.create(name)
    cgroups.apply(SandboxLimits(memory_mb=64))
    try:
        yield cgroups
    finally:
        cgroups.kill_all()
        below = cgroups.paths["memory"] / "sandbox"
        assert below.parent.name == name
        with contextlib.suppress(OSError):
            below.rmdir()
        cgroups.reap_blocking()


def _run_in(group: Path, code: str, *args: str) -> int:
    """Run python `code` in the memory group `group`; its exit code."""

    def join() -> None:
        (group / "cgroup.procs").write_text(str(os.getpid()))

    done = subprocess.run(
        [sys.executable, "-c", code, *args], preexec_fn=join, capture_output=True, timeout=60
    )
    return done.returncode


def _oom_kills(group: Path) -> int:
    fields = (group / "memory.oom_control").read_text().split()
    return int(fields[fields.index("oom_kill") + 1])


def test_a_peak_at_the_limit_without_an_oom_kill_is_no_event(run_group: Cgroups) -> None:
    memory = run_group.paths["memory"]
    code = FILL.replace("LIMIT_SLACK", str(LIMIT_SLACK))
    assert _run_in(memory, code, str(memory)) == 0
    peak = int((memory / "memory.max_usage_in_bytes").read_text())
    assert peak >= 64 * MB - LIMIT_SLACK and _oom_kills(memory) == 0  # within the slack, alive
    assert run_group.memory_event() == ""


def test_an_oom_kill_at_the_limit_below_the_runs_group_is_the_limits(run_group: Cgroups) -> None:
    """runsc's sandbox group is below the run's: v1 counts the kill there only."""
    below = run_group.paths["memory"] / "sandbox"
    below.mkdir()
    assert _run_in(below, HOG) == -signal.SIGKILL
    assert _oom_kills(below) == 1 and _oom_kills(run_group.paths["memory"]) == 0
    assert run_group.memory_event() == "limit"


def test_an_oom_kill_under_the_runs_limit_is_global(run_group: Cgroups) -> None:
    """A group of the test's below the run's, tighter than it (32 MB), stands for a global OOM
    kill: the run's own limit is never reached, and the kill is counted in that group only."""
    below = run_group.paths["memory"] / "sandbox"
    below.mkdir()
    (below / "memory.limit_in_bytes").write_text(str(32 * MB))
    assert _run_in(below, HOG) == -signal.SIGKILL
    assert run_group.memory_event() == "global"


def _fake_group(path: Path, oom_control: str, peak: int) -> Cgroups:
    path.mkdir()
    (path / "memory.oom_control").write_text(oom_control)
    (path / "memory.limit_in_bytes").write_text(str(64 * MB))
    (path / "memory.max_usage_in_bytes").write_text(str(peak))
    (path / "memory.failcnt").write_text("0")
    return Cgroups({"memory": path})


def test_where_the_kernel_counts_no_oom_kills_a_peak_is_only_reached(tmp_path: Path) -> None:
    uncounted = "oom_kill_disable 0\nunder_oom 0\n"  # before Linux 4.13
    assert _fake_group(tmp_path / "a", uncounted, 64 * MB).memory_event() == "reached"
    assert _fake_group(tmp_path / "b", uncounted, 16 * MB).memory_event() == ""
    counted = uncounted + "oom_kill 0\n"
    assert _fake_group(tmp_path / "c", counted, 64 * MB).memory_event() == ""


LOST = {"status": "failed", "tests_passed": 0, "tests_total": 1, "lost": "exited"}
LIMITS = SandboxLimits(timeout_s=5, cpu_s=2, memory_mb=64)


def _judged(expected: int = 1, **fields: Any) -> tuple[ExecStatus, str]:
    seen: dict[str, Any] = {
        "timed_out": False,
        "duration_ms": 1,
        "exit": None,
        "memory": "reached",
        "stdout": Capture(100),
        "stderr": Capture(100),
        "killed": False,
    }
    result = judge(Observed(LOST, **{**seen, **fields}), expected, LIMITS, "local", "cgroup")
    return result.status, result.detail


def test_a_limit_reached_without_a_kill_count_blames_only_a_sigkill() -> None:
    memory = (ExecStatus.MEMORY_EXCEEDED, "killed by the memory limit")
    assert _judged(exit=Exit(signal.SIGKILL)) == memory
    assert _judged(exit=Exit(signal.SIGXCPU)) == (ExecStatus.TIMEOUT, "CPU limit of 2s")
    assert _judged(exit=Exit(signal.SIGKILL, cpu_s=2.5))[0] == ExecStatus.TIMEOUT
    assert _judged(0, exit=Exit(0)) == (ExecStatus.PASSED, "")
    assert _judged(exit=Exit(3 << 8))[0] == ExecStatus.FAILED
    with pytest.raises(SandboxInfraError, match="sandbox died"):  # the platform's, retried
        _judged(exit=Exit(signal.SIGKILL, fault="the gVisor sandbox died"))


# -- whole runs on bwrap ----------------------------------------------------------------------

TOUCHED = """
import os, signal, time
signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGUSR1}})
block = bytearray(60 << 20)
block[::4096] = b"x" * len(block[::4096])
del block
open("/proc/self/comm", "w").write("{mark}")
def add(a, b):
    signal.sigwait({{signal.SIGUSR1}})
    while True:
        pass
"""
"""Touches 60 of its 64 MB and frees them at load, then names itself; its add() waits for
SIGUSR1, then spins to its CPU limit."""


def _near_the_limit_then(act: Callable[[psutil.Process], None]) -> Callable[[psutil.Process], None]:
    """`act`, once the run's group is seen to have come within `LIMIT_SLACK` of its limit
    with no OOM kill (else the test would prove nothing)."""

    def check_then_act(process: psutil.Process) -> None:
        group = memory_cgroup_of(process.pid)
        peak = int((group / "memory.max_usage_in_bytes").read_text())
        limit = int((group / "memory.limit_in_bytes").read_text())
        assert peak >= limit - LIMIT_SLACK, f"peak {peak} never came near {limit}"
        assert _oom_kills(group) == 0
        act(process)

    return check_then_act


@needs_root
@pytest.mark.asyncio
async def test_the_cpu_limit_after_a_freed_memory_peak_is_a_timeout() -> None:
    name = mark()
    go = _near_the_limit_then(lambda process: process.send_signal(signal.SIGUSR1))
    limits = SandboxLimits(timeout_s=8, cpu_s=2, memory_mb=64)
    assert await strike(name, TOUCHED.format(mark=name), limits, go) == ExecStatus.TIMEOUT


@needs_root
@pytest.mark.asyncio
async def test_a_foreign_sigkill_after_a_freed_memory_peak_is_a_platform_fault() -> None:
    name = mark()
    kill = _near_the_limit_then(lambda process: process.send_signal(signal.SIGKILL))
    limits = SandboxLimits(timeout_s=8, cpu_s=2, memory_mb=64)
    assert await strike(name, TOUCHED.format(mark=name), limits, kill) == INFRA
