"""A limit the run reached once is no cause of an end that something else explains.

`pids.peak >= pids.max` and a memory peak near the limit are high-water marks of the whole run,
yet the judge put "its process limit was reached → failed" before the CPU limit and the clean
exit of a run without tests: on bwrap a program that met its thread cap once (a `RuntimeError`,
caught) and then exited 0 was failed ("reached its limit of 8 processes"), one that then spun
to its CPU limit was failed too, not a timeout (gVisor judged both right). Real bwrap runs
here, then the rules' order on fabricated observations (`judge._ended_early`).
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.judge import Exit, Observed, judge
from infra.sandbox.process import Capture
from tests.infra.sandbox.verifier_box import Box, needs_root

CAPPED = """
import os, threading, time
started = []
try:
    for _ in range(40):
        thread = threading.Thread(target=time.sleep, args=(0.3,), daemon=True)
        thread.start()
        started.append(thread)
except RuntimeError:
    print("capped", flush=True)
for thread in started:
    thread.join()
"""
"""Threads past its process cap of 8: a few start, the next one is refused (caught)."""
NPROC = SandboxLimits(timeout_s=8, cpu_s=2, max_processes=8)
ADD = "def add(a, b):\n    return a + b\n"


@needs_root
def test_a_clean_exit_after_meeting_the_process_cap_passes_a_run_without_tests(box: Box) -> None:
    result = box.run(CAPPED + "os._exit(0)\n", limits=NPROC)
    assert "capped" in result.stdout, result  # it did reach its cap
    assert (result.status, result.exit_code) == (ExecStatus.PASSED, 0), result


@needs_root
def test_the_cpu_limit_after_meeting_the_process_cap_is_a_timeout(box: Box) -> None:
    result = box.run(CAPPED + "while True:\n    pass\n", limits=NPROC)
    assert "capped" in result.stdout, result
    assert (result.status, result.detail) == (ExecStatus.TIMEOUT, "CPU limit of 2s"), result


@needs_root
def test_an_unexplained_early_end_at_the_process_cap_still_blames_it(box: Box) -> None:
    """The control: an exit 1 (no tests run) of a program that met its cap is the cap's."""
    result = box.run(CAPPED + "os._exit(1)\n" + ADD, "assert add(1, 2) == 3\n", limits=NPROC)
    assert "capped" in result.stdout, result
    assert result.status == ExecStatus.FAILED, result
    assert result.detail == "reached its limit of 8 processes", result


LOST = {"status": "failed", "tests_passed": 0, "tests_total": 1, "lost": "exited"}
LIMITS = SandboxLimits(timeout_s=5, cpu_s=2, max_processes=8)


def _judged(expected: int = 1, **fields: Any) -> tuple[ExecStatus, str]:
    seen: dict[str, Any] = {
        "timed_out": False,
        "duration_ms": 1,
        "exit": None,
        "memory": "",
        "stdout": Capture(100),
        "stderr": Capture(100),
        "killed": False,
        "process_limit": True,
    }
    result = judge(Observed(LOST, **{**seen, **fields}), expected, LIMITS, "local", "cgroup")
    return result.status, result.detail


@pytest.mark.parametrize(
    ("expected", "fields", "judged"),
    [
        (0, {"exit": Exit(0)}, (ExecStatus.PASSED, "")),
        (1, {"exit": Exit(signal.SIGXCPU)}, (ExecStatus.TIMEOUT, "CPU limit of 2s")),
        (1, {"exit": Exit(signal.SIGKILL, cpu_s=2.5)}, (ExecStatus.TIMEOUT, "CPU limit of 2s")),
        (1, {"exit": Exit(0)}, (ExecStatus.FAILED, "reached its limit of 8 processes")),
        (1, {"exit": Exit(3 << 8)}, (ExecStatus.FAILED, "reached its limit of 8 processes")),
        (1, {"killed": True}, (ExecStatus.FAILED, "reached its limit of 8 processes")),
        (1, {"memory": "limit"}, (ExecStatus.MEMORY_EXCEEDED, "killed by the memory limit")),
    ],
)
def test_the_process_limit_explains_an_end_only_when_nothing_else_does(
    expected: int, fields: dict[str, Any], judged: tuple[ExecStatus, str]
) -> None:
    assert _judged(expected, **fields) == judged


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"exit": Exit(signal.SIGKILL)}, "killed from outside"),
        ({"memory": "global"}, "outside the run's own memory limit"),
        ({"exit": Exit(signal.SIGKILL, fault="the gVisor sandbox died")}, "sandbox died"),
    ],
)
def test_a_platform_fault_at_the_process_cap_stays_a_platform_fault(
    fields: dict[str, Any], reason: str
) -> None:
    """Reaching the cap makes no SIGKILL and no OOM kill: they stay the platform's (retried)."""
    with pytest.raises(SandboxInfraError, match=reason):
        _judged(**fields)
