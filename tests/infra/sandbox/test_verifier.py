"""The two-process verifier (local backend) against real bwrap and zygotes: statuses, what
crosses the channel, exceptions, limits, output, task helpers, hidden tests. Its sandbox and
lifecycle are in test_confinement.py, hostile programs in test_adversarial.py."""

from __future__ import annotations

import asyncio

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits, TaskSpec
from infra.sandbox.base import JobTooLarge
from infra.sandbox.judge import starvation_bound, unproven_memory
from infra.tasks.humaneval import humaneval_tasks
from tests.infra.sandbox.verifier_box import Box, needs_root

pytestmark = needs_root

ADD = "def add(a, b):\n    return a + b\n"
CHECK = "def check(candidate):\n    assert candidate(2, 3) == 5\n"


def test_honest_program_passes_and_every_unit_is_counted(box: Box) -> None:
    tests = "assert add(1, 1) == 2\nx = add(2, 2)\nassert x == 4\n" + CHECK
    result = box.run(ADD + "print('hello')\n", tests, "add")
    assert result.status == ExecStatus.PASSED, result
    assert (result.tests_passed, result.tests_total) == (3, 3) and result.stdout == "hello\n"


def test_wrong_program_fails_with_the_tests_traceback(box: Box) -> None:
    result = box.run("def add(a, b):\n    return a - b\n", "assert add(1, 1) == 2\n" + CHECK, "add")
    assert result.status == ExecStatus.FAILED and result.tests_passed == 0, result
    assert (
        'File "tests.py", line 3, in check' in result.stderr and "AssertionError" in result.stderr
    )


def test_program_exceptions_arrive_as_builtin_exceptions(box: Box) -> None:
    program = """
        class Negative(ValueError):
            pass
        def root(x):
            if x < 0:
                raise Negative(f"negative: {x}")
            if x == 0:
                raise KeyError("zero")
            return x ** 0.5
    """
    tests = """
        def check(candidate):
            try:
                candidate(-4)
            except ValueError as exc:
                assert str(exc) == "negative: -4"
            else:
                raise AssertionError("no ValueError")
            try:
                candidate(0)
            except KeyError as exc:
                assert exc.args == ("zero",)
            assert candidate(9) == 3.0
    """
    result = box.run(program, tests, "root")
    assert result.status == ExecStatus.PASSED, result


def test_an_uncaught_program_exception_shows_both_tracebacks(box: Box) -> None:
    result = box.run("def add(a, b):\n    return a / 0\n", CHECK, "add")
    assert result.status == ExecStatus.ERROR and result.detail == "ZeroDivisionError", result
    assert 'File "tests.py", line 2, in check' in result.stderr
    assert 'File "program.py", line 2, in add' in result.stderr and "return a / 0" in result.stderr


def test_task_defined_exception_classes_are_matched_by_name(box: Box) -> None:
    helpers = "class InvalidInput(Exception):\n    pass\n"
    program = helpers + "def parse(s):\n    raise InvalidInput(s)\n"
    tests = "def check(candidate):\n    try:\n        candidate('x')\n    except InvalidInput:\n        return\n    assert False\n"
    assert box.run(program, tests, "parse", helpers).status == ExecStatus.PASSED
    assert (
        box.run(program, tests, "parse").status == ExecStatus.ERROR
    )  # no task class: ProgramError


def test_a_value_that_is_not_plain_data_fails_its_unit_only(box: Box) -> None:
    program = "def f(x):\n    if x == 2:\n        return (i for i in range(3))\n    return x\n"
    tests = "assert f(1) == 1\nassert f(2) == [0, 1, 2]\nassert f(3) == 3\n"
    result = box.run(program, tests)
    assert result.status == ExecStatus.FAILED and (result.tests_passed, result.tests_total) == (
        2,
        3,
    )
    assert "generator, not plain data" in result.stderr, result


def test_a_fault_the_test_swallows_still_fails_the_unit(box: Box) -> None:
    program = "def f():\n    return object()\n"
    tests = "def check(candidate):\n    try:\n        candidate()\n    except BaseException:\n        pass\n"
    result = box.run(program, tests, "f")
    assert result.status == ExecStatus.FAILED and result.tests_passed == 0, result


def test_plain_values_cross_and_compare_in_the_checker(box: Box) -> None:
    program = """
        def f():
            return [float("nan"), float("inf"), -0.0, {1, 2}, frozenset({3}), (4, b"5"), {"k": None}, True, 2**100, 1j]
        LIMIT = 7
        def double(x):
            return 2 * x
    """
    tests = """
        import math
        v = f()
        assert math.isnan(v[0]) and v[0] != v[0] and v[1] == math.inf and math.copysign(1, v[2]) == -1
        assert v[3] == {1, 2} and v[4] == frozenset({3}) and v[5] == (4, b"5") and v[6] == {"k": None}
        assert v[7] is True and v[8] == 2**100 and v[9] == 1j
        assert LIMIT == 7 and double(LIMIT) == 14
    """
    result = box.run(program, tests)
    assert result.status == ExecStatus.PASSED and result.tests_passed == 4, result


def test_names_that_shadow_builtins_do_not_reach_the_tests(box: Box) -> None:
    result = box.run(
        "def abs(x):\n    return 0\ndef f(x):\n    return -x\n", "assert abs(f(2)) == 2\n"
    )
    assert result.status == ExecStatus.PASSED, result


@pytest.mark.parametrize(
    ("program", "status", "detail"),
    [
        ("x = 1 / 0\n", ExecStatus.ERROR, "ZeroDivisionError"),
        ("def add(a, b)\n    return a\n", ExecStatus.ERROR, "SyntaxError"),
        ("x = bytearray(64 * 2**30)\n", None, "MemoryError"),  # refused before it used any
        ("import sys\nsys.exit(0)\n", ExecStatus.FAILED, "CandidateFault"),
        ("while True:\n    pass\n", ExecStatus.TIMEOUT, "wall-clock deadline of 1.5s"),
    ],
)
def test_top_level_outcomes(box: Box, program: str, status: ExecStatus | None, detail: str) -> None:
    """None: a MemoryError with no memory limit hit (`judge.unproven_memory`)."""
    result = box.run(program, CHECK, "add", limits=SandboxLimits(timeout_s=1.5))
    status = status or unproven_memory(result.backend, result.enforcement)
    assert result.status == status and result.detail == detail and result.tests_passed == 0, result


@pytest.mark.parametrize(
    ("tests", "helpers", "program", "detail", "error"),
    [
        ("import no_such_module\n" + CHECK, "", ADD, "ModuleNotFoundError", "no_such_module"),
        ("raise AssertionError('setup')\n" + CHECK, "", ADD, "AssertionError", "setup"),
        (CHECK, "raise RuntimeError('broken helper')\n", ADD, "RuntimeError", "broken helper"),
        (CHECK, "assert False, 'helper'\n", ADD, "AssertionError", "helper"),
        (CHECK, "", "def sub(a, b):\n    return a - b\n", "NameError", "does not define add()"),
        ("x = 1\n", "", ADD, "NameError", "the tests do not define check(candidate)"),
    ],
)
def test_a_task_whose_tests_cannot_run_is_an_error_of_the_run_not_a_platform_fault(
    box: Box, tests: str, helpers: str, program: str, detail: str, error: str
) -> None:
    """Broken tests or helpers, a missing entry point or check(): the verdict says which, as
    `error` with nothing passed (`tempered tasks validate` reports such a task)."""
    result = box.run(program, tests, "add", helpers=helpers)
    assert result.status == ExecStatus.ERROR and result.tests_passed == 0, result
    assert result.detail == detail and error in result.stderr, result


HIDDEN = "assert add(40, 2) == 42\n"


@pytest.mark.parametrize(
    ("program", "hidden", "status", "reported"),
    [
        ("def add(a, b):\n    return 5\n", HIDDEN, ExecStatus.FAILED, "AssertionError"),
        (
            "def add(a, b):\n    if a == 40:\n        raise ValueError(f'want {a + b}')\n"
            "    return a + b\n",
            HIDDEN,
            ExecStatus.ERROR,
            "ValueError",
        ),
        (ADD, "import no_such_module_42\n" + HIDDEN, ExecStatus.ERROR, "ModuleNotFoundError"),
        (ADD, "assert add(40, 2) == (42\n", ExecStatus.ERROR, "SyntaxError"),
    ],
)
def test_a_failing_hidden_test_is_reported_by_its_exception_type_alone(
    box: Box, program: str, hidden: str, status: ExecStatus, reported: str
) -> None:
    """No source line, message (the program's own: `want 42`) or traceback of a hidden unit:
    what a program could special-case on its next turn."""
    result = box.run(program, CHECK, "add", hidden_tests=hidden)
    assert result.status == status and result.detail == reported, result
    assert result.tests_total == 2 and f"a hidden test failed ({reported})" in result.stderr
    assert "42" not in result.stderr + result.stdout and "add(40" not in result.stderr, result


def test_hidden_tests_run_after_check_and_count_in_the_verdict(box: Box) -> None:
    tests = "seen = []\ndef check(candidate):\n    seen.append(candidate(2, 3))\n    assert seen == [5]\n"
    result = box.run(ADD, tests, "add", hidden_tests="assert seen == [5]\n" + HIDDEN)
    assert result.status == ExecStatus.PASSED and result.tests_passed == result.tests_total == 3
    wrong = box.run("def add(a, b):\n    return 0\n", CHECK, "add", hidden_tests=HIDDEN)
    assert wrong.status == ExecStatus.FAILED and (wrong.tests_passed, wrong.tests_total) == (0, 2)
    assert 'File "tests.py", line 2, in check' in wrong.stderr  # a shown failure still shows
    assert wrong.stderr.endswith("a hidden test failed (AssertionError)\n"), wrong.stderr


@pytest.mark.parametrize(
    ("program", "status"),
    [
        ("print('out')\n", ExecStatus.PASSED),
        ("import sys\nsys.exit(0)\n", ExecStatus.PASSED),
        ("import sys\nsys.exit(3)\n", ExecStatus.FAILED),
        ("import os\nos._exit(0)\n", ExecStatus.PASSED),
        ("import os\nos._exit(4)\n", ExecStatus.FAILED),
        ("raise ValueError('x')\n", ExecStatus.ERROR),
    ],
)
def test_programs_without_tests(box: Box, program: str, status: ExecStatus) -> None:
    result = box.run(program)
    assert result.status == status and result.tests_total == 0, result


def test_a_call_that_never_returns_times_out(box: Box) -> None:
    result = box.run(
        "def add(a, b):\n    while True:\n        pass\n",
        CHECK,
        "add",
        limits=SandboxLimits(timeout_s=1),
    )
    assert result.status == ExecStatus.TIMEOUT, result  # after 1 s of CPU, or of wall if idle
    assert result.duration_ms < (starvation_bound(1) + 1) * 1000, result


def test_the_cpu_limit_is_a_timeout(box: Box) -> None:
    program = "import threading\ndef spin():\n    while True:\n        pass\nfor _ in range(3):\n    threading.Thread(target=spin).start()\nspin()\n"
    result = box.run(program, CHECK, "add", limits=SandboxLimits(timeout_s=20, cpu_s=1))
    assert result.status == ExecStatus.TIMEOUT and "CPU limit" in result.detail, result


def test_memory_growth_is_stopped_by_the_cgroup(box: Box) -> None:
    program = "blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 20))\n    blocks[-1][::4096] = b'x' * 256\n"
    result = box.run(program, CHECK, "add", limits=SandboxLimits(timeout_s=20, memory_mb=64))
    assert result.status == ExecStatus.MEMORY_EXCEEDED, result


def test_output_is_captured_and_capped(box: Box) -> None:
    program = "import sys\nprint('o' * 5000)\nsys.stderr.write('e' * 5000)\n" + ADD
    result = box.run(program, CHECK, "add", limits=SandboxLimits(timeout_s=5, output_bytes=1024))
    assert result.status == ExecStatus.PASSED and result.truncated, result
    # the first and the latest halves of each stream, a note in place of the rest
    for text, char, came in ((result.stdout, "o", 5001), (result.stderr, "e", 5000)):
        assert len(text) == 1024 and f"of its {came} bytes left out ...]" in text, text
        assert text.startswith(char * 400) and text.rstrip("\n").endswith(char * 400), text


def test_a_job_past_the_checkers_frame_is_refused_for_good(box: Box) -> None:
    """A program past the codec's 16 MiB frame raised a bare TypeError (codec.NotPlainData),
    retried for ever: it is `JobTooLarge`, the request's fault (as on Kubernetes)."""
    with pytest.raises(JobTooLarge, match="16777216"):
        box.run("BIG = '" + "x" * (16 << 20) + "'\n" + ADD, CHECK, "add")
    assert box.run(ADD, CHECK, "add").status == ExecStatus.PASSED


def test_a_thread_flooding_stdout_after_the_answers_does_not_hold_the_host(box: Box) -> None:
    flood = "import sys, threading\ndef flood():\n    while True:\n        sys.stdout.write('x' * 65536)\n"
    program = flood + "threading.Thread(target=flood, daemon=True).start()\n" + ADD
    result = box.run(program, CHECK, "add", limits=SandboxLimits(timeout_s=5, output_bytes=4096))
    assert result.status == ExecStatus.PASSED and result.duration_ms < 4000, result
    assert len(result.stdout) <= 4096


@pytest.mark.parametrize("number", [0, 32, 38, 50])
def test_humaneval_tasks_with_prompt_helpers(box: Box, number: int) -> None:
    task = humaneval_tasks()[number]
    limits = SandboxLimits(timeout_s=30)
    good = box.run(
        task.canonical_solution or "", task.tests, task.entry_point, task.helpers, limits
    )
    bad = box.run(task.wrong_solution or "", task.tests, task.entry_point, task.helpers, limits)
    assert good.status == ExecStatus.PASSED, good
    assert bad.status in (ExecStatus.FAILED, ExecStatus.ERROR), bad  # /32: poly(xs, None) raises


@pytest.mark.slow
def test_all_of_humaneval_at_k5_and_concurrency_8(box: Box) -> None:
    """Every canonical solution passes 5 times out of 5 and every `return None` mutant fails."""
    limits, gate = SandboxLimits(timeout_s=30), asyncio.Semaphore(8)

    async def one(program: str, task: TaskSpec) -> tuple[str, ExecStatus]:
        async with gate:
            result = await box.run_async(
                program, task.tests, task.entry_point, task.helpers, limits
            )
            return task.id, result.status

    async def everything() -> tuple[list[tuple[str, ExecStatus]], list[tuple[str, ExecStatus]]]:
        tasks = humaneval_tasks()
        good = [one(t.canonical_solution or "", t) for t in tasks for _ in range(5)]
        bad = [one(t.wrong_solution or "", t) for t in tasks]
        return list(await asyncio.gather(*good)), list(await asyncio.gather(*bad))

    good, bad = box.loop.run_until_complete(everything())
    assert len(good) == 820 and [r for r in good if r[1] != ExecStatus.PASSED] == []
    assert len(bad) == 164 and [r for r in bad if r[1] == ExecStatus.PASSED] == []
