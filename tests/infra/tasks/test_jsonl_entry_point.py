"""A code task's tests must define `check(candidate)`: the checker calls `check(<entry point>)`
after them, and tests in assert form (`assert add(2, 3) == 5`) define none, so every program
failed with a NameError. Such a task file loaded silently and no program could pass it; now
`read_jsonl` refuses it with one line naming the file and line (`TaskSpec.load_problem`,
`contracts.task_tests.defines_check`: the predicate `tempered sandbox run --entry-point` may share)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from contracts.task import SandboxLimits, TaskSpec
from contracts.task_tests import defines_check
from infra.tasks import load_suite
from infra.tasks.jsonl import read_jsonl
from tests.infra.environments.conftest import needs_root

ADD = "def add(a, b):\n    return a + b\n"
ASSERTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
CHECK = "def check(candidate):\n    assert candidate(2, 3) == 5\n"


def line(tests: str, helpers: str = "", task_id: str = "add-1") -> str:
    return json.dumps(
        {
            "id": task_id,
            "prompt": "Write add(a, b) returning a + b.",
            "entry_point": "add",
            "tests": tests,
            "helpers": helpers,
            "canonical_solution": ADD,
        }
    )


def test_assert_style_tests_with_an_entry_point_are_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "user.jsonl"
    path.write_text(line(CHECK, task_id="fine") + "\n\n" + line(ASSERTS) + "\n")
    with pytest.raises(ValueError) as refused:
        load_suite(str(path))
    message = str(refused.value)
    assert "\n" not in message
    assert re.match(rf"^{re.escape(str(path))}:3: tests: ", message), message
    assert "check(candidate)" in message and "'add'" in message, message


@pytest.mark.parametrize(
    ("tests", "helpers"),
    [
        (CHECK, ""),
        (ASSERTS, CHECK),  # the helpers run in the checker's namespace too
        (ASSERTS + "check = lambda candidate: None\n", ""),
        ("from math import isclose as check\n", ""),
        ("assert add(2, 3) == (5\n", ""),  # not Python: the checker fails every program on it
    ],
)
def test_tests_or_helpers_that_bind_check_load(tests: str, helpers: str, tmp_path: Path) -> None:
    path = tmp_path / "user.jsonl"
    path.write_text(line(tests, helpers) + "\n")
    assert [task.id for task in read_jsonl(path)] == ["add-1"]


@pytest.mark.parametrize(
    "tests",
    [
        "def t():\n    check = add(2, 3)\n    assert check == 5\nt()\n",  # a function's local
        "for check in [((2, 3), 5)]:\n    assert add(*check[0]) == check[1]\n",  # a loop's
        "class T:\n    def check(self):\n        assert add(2, 3) == 5\n",  # a method
    ],
)
def test_a_check_no_module_level_binding_defines_is_refused(tests: str, tmp_path: Path) -> None:
    """A `check` bound only inside a function, class or loop loaded, and then every program
    failed with "the tests do not define check(candidate)"."""
    path = tmp_path / "user.jsonl"
    path.write_text(line(tests) + "\n")
    with pytest.raises(ValueError, match="check\\(candidate\\)"):
        read_jsonl(path)


def test_the_rule_is_asked_where_tasks_load_not_on_decode() -> None:
    """A suite stored by an earlier run must still decode (`TaskSpec.load_problem`)."""
    task = TaskSpec.model_validate_json(line(ASSERTS))
    assert task.tests == ASSERTS
    assert (task.load_problem() or "").startswith("tests: ")
    assert defines_check(CHECK) and defines_check(ASSERTS, CHECK) and not defines_check(ASSERTS)


@needs_root
def test_the_verifier_fails_every_program_on_such_a_task() -> None:
    """Why the rule: the canonical solution of an assert-style task with an entry point fails
    in the real sandbox (were the checker to accept it one day, the rule would be wrong)."""
    from infra.sandbox import get_backend
    from infra.settings import Settings

    task = TaskSpec.model_validate_json(line(ASSERTS))

    async def run() -> tuple[str, str]:
        backend = get_backend(Settings(), "local")
        try:
            result = await backend.run(ADD, task.tests, SandboxLimits(), task.entry_point)
        finally:
            await backend.close()
        return result.status.value, result.stderr

    status, stderr = asyncio.run(run())
    assert status != "passed" and "check(candidate)" in stderr, (status, stderr)
