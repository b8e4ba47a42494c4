"""The `code` environment: the action is the answer, the observation its test log, and the
score whether the last answer passes (through the real local backend). A task's hidden tests
count in the verdict and never show in the observation: a program that answers exactly what its
feedback showed (the `starter` suite's shown asserts) is not paid for it."""

from __future__ import annotations

import ast

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits, TaskSpec
from infra.environments.code import CodeEnvironment
from infra.inference.prompts import feedback_text
from infra.sandbox.local import LocalBackend
from infra.tasks import load_suite
from tests.infra.environments.conftest import needs_root

pytestmark = [needs_root, pytest.mark.asyncio]
TASK = TaskSpec(
    id="add",
    prompt="Write add(a, b).",
    entry_point="add",
    tests="def check(candidate):\n    assert candidate(2, 3) == 5\n",
)


async def test_answers_are_run_against_the_tests() -> None:
    backend = LocalBackend(warm=0)
    env = CodeEnvironment(backend)
    try:
        state = await env.reset(TASK, "s0")
        state, seen = await env.step(state, "def add(a, b):\n    return a - b\n", SandboxLimits())
        assert seen.status is ExecStatus.FAILED and not seen.submitted
        assert seen.text.startswith("status: failed (0/1 tests)") and "AssertionError" in seen.text
        state, seen = await env.step(state, "def add(a, b):\n    return a + b\n", SandboxLimits())
        assert seen.submitted and env.tools == ()
        graded = await env.verify(TASK, state, SandboxLimits())
        assert graded.score == 1.0 and graded.result.status is ExecStatus.PASSED
        assert await env.close(["s0"]) == 0
    finally:
        await backend.close()


def _shown_cases(task: TaskSpec) -> dict[str, object]:
    """The shown asserts' input -> output pairs (`repr(args)` -> the expected value), read from
    the task's `check(candidate)`: all that the feedback of a failed turn can quote."""
    (check,) = ast.parse(task.tests).body
    assert isinstance(check, ast.FunctionDef)
    cases: dict[str, object] = {}
    for statement in check.body:
        assert isinstance(statement, ast.Assert)
        call = next(
            n
            for n in ast.walk(statement.test)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "candidate"
        )
        args = tuple(ast.literal_eval(arg) for arg in call.args)
        cases[repr(args)] = ast.literal_eval(_expected(statement.test))
    return cases


def _expected(test: ast.expr) -> ast.expr:
    """The expected value of `candidate(...) == X` or `abs(candidate(...) - X) < tolerance`."""
    assert isinstance(test, ast.Compare)
    if isinstance(test.ops[0], ast.Eq):
        return test.comparators[0]
    assert isinstance(test.left, ast.Call) and isinstance(test.left.args[0], ast.BinOp)
    return test.left.args[0].right


def special_casing(task: TaskSpec) -> str:
    """A program that answers exactly the shown asserts and nothing else: the reward hack."""
    return (
        f"SHOWN = {_shown_cases(task)!r}\n"
        f"def {task.entry_point}(*args):\n"
        "    return SHOWN.get(repr(args))\n"
    )


def _one_task_per_family() -> list[TaskSpec]:
    first: dict[str, TaskSpec] = {}
    for task in load_suite("starter"):
        first.setdefault(task.id.rsplit("-", 1)[0], task)
    return list(first.values())


async def test_special_casing_what_was_shown_passes_the_shown_tests_only() -> None:
    """Before hidden tests, the feedback quoted the very asserts the verdict was graded on."""
    backend = LocalBackend(warm=0)
    try:
        for task in _one_task_per_family():
            program, point = special_casing(task), task.entry_point
            shown = await backend.run(program, task.tests, SandboxLimits(), point)
            assert shown.status is ExecStatus.PASSED, (task.id, shown)
            judged = await backend.run(
                program, task.tests, SandboxLimits(), point, hidden_tests=task.hidden_tests
            )
            assert judged.status is not ExecStatus.PASSED, (task.id, judged)
    finally:
        await backend.close()


async def test_a_failed_hidden_assert_shows_neither_its_source_nor_its_expected_value() -> None:
    """What the model reads after a failed turn (the environment's test log, and the training
    prompt's feedback) holds no hidden assert and none of their expected values."""
    distinct = [  # whose hidden expected values appear nowhere else the model reads
        t
        for t in load_suite("starter")
        if t.hidden_tests
        and "abs(" not in t.hidden_tests
        and all(len(x) >= 3 and x not in t.tests + t.prompt for x in _hidden_expected(t))
    ]
    assert distinct, "no starter task has hidden tests"
    task = distinct[0]
    backend = LocalBackend(warm=0)
    env = CodeEnvironment(backend)
    try:
        state = await env.reset(task, "s0")
        _, seen = await env.step(state, special_casing(task), SandboxLimits())
        result = await backend.run(
            special_casing(task),
            task.tests,
            SandboxLimits(),
            task.entry_point,
            hidden_tests=task.hidden_tests,
        )
    finally:
        await backend.close()
    assert seen.status is ExecStatus.FAILED and result.status is ExecStatus.FAILED, seen.text
    assert "a hidden test failed (AssertionError)" in seen.text
    for text in (seen.text, feedback_text(result), result.stderr):
        for line in task.hidden_tests.splitlines():
            assert line not in text and line.split("==")[0].strip() not in text, text
        for expected in _hidden_expected(task):
            assert expected not in text, (expected, text)


def _hidden_expected(task: TaskSpec) -> list[str]:
    """The source of each hidden assert's expected value."""
    return [
        ast.unparse(_expected(statement.test))
        for statement in ast.parse(task.hidden_tests).body
        if isinstance(statement, ast.Assert)
    ]
