"""How the host judges a verifier run: its own unit count, early ends, platform faults."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import SandboxLimits
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.judge import (
    Exit,
    Observed,
    deadline_state,
    expected_units,
    judge,
    split_tests,
    starvation_bound,
)
from infra.sandbox.process import Capture

FAST = SandboxLimits(timeout_s=5, cpu_s=2)
PASSED = {
    "status": "passed",
    "tests_passed": 1,
    "tests_total": 1,
    "error": "",
    "exc_type": "",
    "lost": "",
}
LOST = {**PASSED, "status": "failed", "tests_passed": 0, "lost": "exited"}
EXITED_3, SIGKILLED, SIGXCPU = 3 << 8, signal.SIGKILL, signal.SIGXCPU  # wait statuses
STOPPED, CONTINUED = signal.SIGUSR1 << 8 | 0x7F, 0xFFFF  # no end: what a tracer's wait sees


def _seen(verdict: dict[str, object] | None, **fields: Any) -> Observed:
    base: dict[str, Any] = {
        "timed_out": False,
        "duration_ms": 1,
        "exit": None,
        "memory": "",
        "stdout": Capture(100),
        "stderr": Capture(100),
        "killed": True,
    }
    return Observed(verdict, **{**base, **fields})


def _judged(seen: Observed, expected: int = 1) -> ExecutionResult:
    return judge(seen, expected, FAST, "local", "cgroup")


def _status(seen: Observed, expected: int = 1) -> ExecStatus:
    return _judged(seen, expected).status


def test_the_host_count_must_match_the_checkers() -> None:
    assert _status(_seen(PASSED)) == ExecStatus.PASSED
    assert _status(_seen(PASSED), expected=2) == ExecStatus.FAILED
    assert _status(_seen({**PASSED, "tests_passed": 0, "tests_total": 0})) == ExecStatus.FAILED


def test_the_host_counts_units_itself() -> None:
    tests = (
        "import math\nassert f(1) == 1\nx = 2\nassert f(x) == 2\ndef check(c):\n    assert c(1)\n"
    )
    assert expected_units(split_tests(tests, None), None) == 2
    assert expected_units(split_tests(tests, "f"), "f") == 3
    assert expected_units(split_tests("def check(c):\n    assert c(1)\n", "f"), "f") == 1
    assert expected_units(split_tests("", None), None) == 0


def test_hidden_tests_are_units_the_host_counts_marked_hidden() -> None:
    """`passed` needs every hidden unit too: the host's count includes them."""
    check, hidden = "def check(c):\n    assert c(1)\n", "x = 3\nassert f(x) == 7\n"
    units = split_tests(check, "f", hidden)
    assert units[0] == {"test": False, "line": 1, "source": check}
    assert units[1:] == [
        {"test": False, "line": 1, "source": "x = 3\n", "hidden": True},
        {"test": True, "line": 2, "source": "assert f(x) == 7\n", "hidden": True},
    ]
    assert expected_units(units, "f") == 2
    assert _status(_seen(PASSED), expected=expected_units(units, "f")) == ExecStatus.FAILED
    # hidden text that does not parse is one hidden test, which the checker fails
    assert split_tests("", "f", "assert f(1) == (2\n") == [
        {"test": True, "line": 1, "source": "assert f(1) == (2\n", "hidden": True}
    ]


@pytest.mark.parametrize(
    "hidden",
    [
        "def check(candidate):\n    assert candidate(40, 2) == 42\n",  # HumanEval's form
        "def check(candidate):\n    assert candidate(40, 2) == 42\nassert f(1, 2) == 3\n",
        "x = f(40, 2)\n",
        "check(f)\n",  # a call is not an assert: one unit, passing whenever it runs
        "# nothing\n",
    ],
)
def test_hidden_tests_without_a_top_level_assert_are_refused(hidden: str) -> None:
    """Hidden `def check(candidate): assert candidate(40, 2) == 42` was one unit that only
    defined `check` (the shown `check` had been called already): a wrong `add` passed 2/2."""
    with pytest.raises(ValueError, match="^hidden tests: they (define check|hold no top-level)"):
        split_tests("def check(c):\n    assert c(1, 2) == 3\n", "f", hidden)


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"memory": "limit"}, ExecStatus.MEMORY_EXCEEDED),
        (
            {"memory": "limit", "exit": Exit(SIGKILLED, fault="sandbox died")},
            ExecStatus.MEMORY_EXCEEDED,
        ),
        ({"process_limit": True}, ExecStatus.FAILED),
        ({"exit": Exit(SIGXCPU), "killed": False}, ExecStatus.TIMEOUT),
        ({"exit": Exit(SIGKILLED, cpu_s=2.5), "killed": False}, ExecStatus.TIMEOUT),
        ({"exit": Exit(EXITED_3), "killed": False}, ExecStatus.FAILED),
        ({"exit": Exit(SIGKILLED)}, ExecStatus.FAILED),  # the host killed it: its status is ours
        (
            {"exit": Exit(SIGKILLED), "killed": False, "sigkill_is_foreign": False},
            ExecStatus.FAILED,
        ),
        ({"exit": Exit(STOPPED), "killed": False}, ExecStatus.FAILED),  # the program's, not ours
        ({"exit": Exit(CONTINUED), "killed": False}, ExecStatus.FAILED),
    ],
)
def test_how_an_early_end_is_judged(fields: dict[str, Any], status: ExecStatus) -> None:
    assert _status(_seen(LOST, **fields)) == status


@pytest.mark.parametrize(
    ("verdict", "fields", "reason"),
    [
        (LOST, {"exit": Exit(SIGKILLED), "killed": False}, "killed from outside"),
        (LOST, {"memory": "global"}, "outside the run's own memory limit"),
        (LOST, {"exit": Exit(SIGKILLED, fault="the candidate zygote died")}, "zygote"),
        # gVisor's own host tasks filled the run's pids group: its program is held inside
        (LOST, {"process_limit": True, "exit": Exit(SIGKILLED, fault="sandbox died")}, "died"),
        ({**LOST, "lost": "not_ready"}, {}, "did not start"),
        (None, {}, "without a verdict"),
    ],
)
def test_platform_faults_are_never_results(
    verdict: dict[str, object] | None, fields: dict[str, Any], reason: str
) -> None:
    with pytest.raises(SandboxInfraError, match=reason):
        judge(_seen(verdict, **fields), 1, FAST, "local", "cgroup")


def test_a_deadline_counts_the_time_the_program_had() -> None:
    one_s = SandboxLimits(timeout_s=1)  # its starvation bound: 1 + max(3, 20) = 21 s
    assert starvation_bound(1) == 21 and starvation_bound(10) == 40
    assert deadline_state(1.2, None, one_s) == "timeout"  # unknown: the wall clock counts
    assert deadline_state(1.2, (0.1, 0.1), one_s) == "timeout"  # it ran or slept: its time
    assert deadline_state(1.2, (1.0, 0.2), one_s) == "running"  # it waited for a CPU: more
    assert deadline_state(7.0, (6.0, 1.0), one_s) == "timeout"  # it got its 1 s at last
    assert deadline_state(1.2, (1.1, 1.2), one_s) == "timeout"  # its own threads starved it
    assert deadline_state(20.0, (19.9, 0.1), one_s) == "running"
    assert deadline_state(21.0, (20.9, 0.1), one_s) == "starved"  # the host never gave it 1 s


def test_the_checkers_wait_for_a_cpu_is_not_the_programs_time() -> None:
    """While the checker runs the tests the program sleeps on its pipe: a starved checker
    leaves no wait of the program's, and was charged to it (a correct program timed out)."""
    one_s = SandboxLimits(timeout_s=1)
    assert deadline_state(1.2, (0.0, 0.1), one_s) == "timeout"
    assert deadline_state(1.2, (0.0, 0.1), one_s, checker_wait_s=1.0) == "running"
    assert deadline_state(1.2, (0.0, 1.2), one_s, checker_wait_s=1.0) == "timeout"  # its CPU
    assert deadline_state(21.0, (0.1, 0.1), one_s, checker_wait_s=20.8) == "starved"
    assert deadline_state(1.2, None, one_s, checker_wait_s=1.0) == "timeout"  # gave it away


def test_a_starved_program_is_the_hosts_fault() -> None:
    with pytest.raises(SandboxInfraError, match="starved"):
        _status(_seen(None, timed_out=True, starved=True))


def test_no_verdict_past_the_deadline_is_a_timeout() -> None:
    assert _status(_seen(None, timed_out=True)) == ExecStatus.TIMEOUT
    assert _status(_seen({**LOST, "lost": "timeout"})) == ExecStatus.TIMEOUT


def test_a_program_without_tests_is_judged_by_its_exit() -> None:
    ended = {"killed": False}
    assert _status(_seen(LOST, exit=Exit(0), **ended), expected=0) == ExecStatus.PASSED
    assert _status(_seen(LOST, exit=Exit(EXITED_3), **ended), expected=0) == ExecStatus.FAILED


def test_units_keep_their_source_lines_and_decorators() -> None:
    tests = "@cache\ndef helper(x):\n    return x\n\nassert f(helper(1)) == 1\n"
    helper, check = split_tests(tests, None)
    assert helper == {"test": False, "line": 1, "source": "@cache\ndef helper(x):\n    return x\n"}
    assert check == {"test": True, "line": 5, "source": "assert f(helper(1)) == 1\n"}
    # tests the host cannot split are one unit: the one test, or the entry point's check
    for whole in ("x = f(1)\n", "assert (\n"):
        assert split_tests(whole, None) == [{"test": True, "line": 1, "source": whole}]
        assert expected_units(split_tests(whole, "f"), "f") == 1


def test_the_checkers_error_reaches_the_log_once() -> None:
    failed = {**PASSED, "status": "failed", "tests_passed": 0, "error": "AssertionError: f(1)"}
    result = _judged(_seen(failed))
    assert result.stderr == "AssertionError: f(1)" and result.exit_code == 0
    logged = Capture(100)
    logged.add(b"Traceback ...\nAssertionError: f(1)\n")
    again = _judged(_seen(failed, stderr=logged))
    assert again.stderr == "Traceback ...\nAssertionError: f(1)\n"


def test_a_lone_surrogate_in_the_report_still_serialises() -> None:
    """The report quotes the program's exception messages (`ValueError(chr(0xD800))`); a
    result that `model_dump_json` refuses would fail the whole group's activity."""
    failed = {**PASSED, "status": "error", "tests_passed": 0, "error": "ValueError: \ud800\n"}
    result = _judged(_seen({**failed, "exc_type": "\udfff"}))
    assert "\\ud800" in result.stderr and result.detail == "\\udfff"
    assert "ud800" in result.model_dump_json()


def test_output_cut_at_its_limit_is_marked_truncated() -> None:
    flood = Capture(4)
    flood.add(b"0123456789")
    assert _judged(_seen(PASSED, stdout=flood)).truncated
    assert not _judged(_seen(PASSED)).truncated


def test_a_broken_protocol_and_the_cpu_limit_reached_exactly() -> None:
    broken = _judged(_seen({**LOST, "lost": "protocol"}, exit=Exit(EXITED_3), killed=False))
    assert broken.status == ExecStatus.FAILED and "call protocol" in broken.detail
    at_limit = _seen(LOST, exit=Exit(SIGKILLED, cpu_s=FAST.cpu_s), killed=False)
    assert _status(at_limit) == ExecStatus.TIMEOUT


def test_a_sandbox_that_never_started_says_what_it_printed() -> None:
    printed = Capture(100)
    printed.add(b"bwrap: cannot mount /proc")
    with pytest.raises(SandboxInfraError, match="did not start: bwrap: cannot mount"):
        _judged(_seen({**LOST, "lost": "not_ready"}, stdout=printed))


@pytest.mark.parametrize(
    ("backend", "enforcement", "memory", "status"),
    [
        ("local", "cgroup", "", ExecStatus.ERROR),  # the cgroup says its limit was not reached
        ("local", "cgroup", "limit", ExecStatus.MEMORY_EXCEEDED),
        ("local", "rlimit", "", ExecStatus.MEMORY_EXCEEDED),  # RLIMIT_AS is the limit
        ("gvisor", "cgroup", "", ExecStatus.MEMORY_EXCEEDED),  # so is its held address space
        ("kubernetes", "kubernetes", "", ExecStatus.MEMORY_EXCEEDED),
    ],
)
def test_a_memory_error_is_memory_exceeded_only_with_the_hosts_evidence(
    backend: str, enforcement: str, memory: str, status: ExecStatus
) -> None:
    """`raise MemoryError('fake')` read memory_exceeded (its feedback said the limit was hit,
    and it counted toward the `abort_after` circuit breaker). Where the run's cgroup bounds its
    memory, only the cgroup's accounting proves it; where an address-space cap does, the host
    cannot tell the allocator's MemoryError from a raised one (tests/infra/sandbox/
    test_forge_memory_error.py runs both)."""
    claimed = {**PASSED, "status": "memory_exceeded", "tests_passed": 0, "exc_type": "MemoryError"}
    result = judge(_seen(claimed, memory=memory), 1, FAST, backend, enforcement)
    assert result.status == status and result.detail == "MemoryError", result
