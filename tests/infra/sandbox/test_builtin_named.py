"""A function under test named like a builtin (`sum`, `round`, `filter`) is the program's in the
tests, and only it: every other builtin name stays the builtin whatever the program defines.

The checker skipped every export named like a builtin (`checker.Run.namespace`), the entry
point too, so a task's `round` or `sum` was the builtin in every test calling it by name: a
wrong or empty program passed those tests and an honest one failed them. The first tests run
the local backend (real bwrap, checker and candidate); the last ones the job's declared names
(`under_test`, which no host sends yet: the functions kind's), a real candidate process
(`candidate.serve`, unsandboxed: the programs are these tests') against the checker's `Run`.
"""

from __future__ import annotations

import os
import time

import pytest

from contracts.sandbox import ExecStatus
from infra.sandbox import candidate
from infra.sandbox.checker import Run
from infra.sandbox.checker_calls import Channel
from infra.sandbox.judge import split_tests
from tests.infra.sandbox.verifier_box import Box, needs_root

HALF_UP = "import math\ndef round(x):\n    return math.floor(x + 0.5)\n"
SUM_TESTS = (
    "def check(candidate):\n    assert candidate([1, 2, 3]) == 6\n"
    "assert sum([1, 2, 3]) == 6\nassert sum([]) == 0\n"
)


@needs_root
def test_an_honest_round_passes_the_hidden_tests_that_call_it_by_name(box: Box) -> None:
    """Half up, as asked: the builtin's banker's rounding failed `round(0.5) == 1` for it."""
    hidden = "assert round(0.5) == 1\nassert round(4.5) == 5\n"
    tests = "def check(candidate):\n    assert candidate(2.5) == 3\n"
    result = box.run(HALF_UP, tests, "round", hidden_tests=hidden)
    assert (result.status, result.tests_passed, result.tests_total) == (
        ExecStatus.PASSED,
        3,
        3,
    ), result


@needs_root
@pytest.mark.parametrize("program", ["def sum(xs):\n    return -1\n", "pass\n"])
def test_a_wrong_or_missing_sum_fails_every_test_calling_it_by_name(box: Box, program: str) -> None:
    """Both passed the two asserts by name (2 of 3) with the builtin's answers."""
    result = box.run(program, SUM_TESTS, "sum")
    assert result.status is not ExecStatus.PASSED and result.tests_passed == 0, result


@needs_root
def test_only_the_entry_point_is_the_programs_not_another_builtin_it_defines(box: Box) -> None:
    """Its `abs` stays the builtin: with it, `abs(round(0.4))` would be 0 and pass."""
    program = "def round(x):\n    return 3\nabs = lambda x: 0\n"
    tests = "def check(candidate):\n    assert candidate(2.5) == 3\n"
    hidden = "assert abs(round(0.4) - 0) < 1e-9\n"
    result = box.run(program, tests, "round", hidden_tests=hidden)
    assert (result.status, result.tests_passed) == (ExecStatus.FAILED, 1), result


@needs_root
def test_a_program_cannot_change_the_tests_abs_beside_another_entry_point(box: Box) -> None:
    program = "abs = lambda x: 0\ndef f(x):\n    return x + 1\n"
    tests = "def check(candidate):\n    assert abs(candidate(1) - 1) < 1e-9\n"
    hidden = "assert abs(f(2) - 2) < 1e-9\n"
    result = box.run(program, tests, "f", hidden_tests=hidden)
    assert (result.status, result.tests_passed) == (ExecStatus.FAILED, 0), result


def evaluate(program: str, tests: str, under_test: list[str]) -> dict[str, object]:
    """The checker's verdict on `program` (no entry point) run by a real candidate process."""
    calls_read, calls_write = os.pipe()
    replies_read, replies_write = os.pipe()
    job_read, job_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the candidate: answers until the checker closes its end
        try:
            for fd in (calls_write, replies_read, job_read, job_write):
                os.close(fd)
            candidate.serve(calls_read, replies_write)
        finally:
            os._exit(0)
    for fd in (calls_read, replies_write):
        os.close(fd)
    job: dict[str, object] = {
        "program": program,
        "units": split_tests(tests, None),
        "tests": tests,
        "entry_point": None,
        "under_test": under_test,
        "deadline_s": 10.0,
        "rlimits": {},
    }
    try:
        run = Run(job, Channel(calls_write, replies_read, time.monotonic() + 10), job_write)
        return run.evaluate()
    finally:
        for fd in (calls_write, replies_read, job_read, job_write):  # ("started",) unread
            os.close(fd)
        os.waitpid(pid, 0)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    ("under_test", "program", "tests", "passed"),
    [
        (
            "sum",
            "def sum(xs):\n    return -1\n",
            "assert sum([1, 2, 3]) == 6\nassert sum([]) == 0\n",
            0,
        ),
        ("sum", "pass\n", "assert sum([1, 2, 3]) == 6\n", 0),
        (
            "filter",
            "def filter(xs):\n    return xs\n",  # wrong: keeps the odd ones
            "assert list(filter(None, [0, 1, 2])) == [1, 2]\n",
            0,
        ),
        (
            "filter",
            "def filter(xs):\n    return [x for x in xs if x % 2 == 0]\nabs = lambda x: 0\n",
            "assert filter([1, 2, 3, 4]) == [2, 4]\nassert abs(len(filter([2])) - 0) == 0\n",
            1,  # its `abs` is not under test: the builtin's 1 fails the second
        ),
    ],
)
def test_declared_names_are_the_programs_without_an_entry_point(
    under_test: str, program: str, tests: str, passed: int
) -> None:
    """The functions kind's form: top-level asserts calling the names the task declares."""
    verdict = evaluate(program, tests, [under_test])
    assert verdict["tests_passed"] == passed and verdict["status"] != "passed", verdict


@pytest.mark.timeout(30)
def test_a_correct_declared_filter_passes() -> None:
    program = "def filter(xs):\n    return [x for x in xs if x % 2 == 0]\n"
    verdict = evaluate(program, "assert filter([1, 2, 3, 4]) == [2, 4]\n", ["filter"])
    assert (verdict["status"], verdict["tests_passed"]) == ("passed", 1), verdict
