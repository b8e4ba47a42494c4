"""`TaskSpec.hidden_tests` must hold a top-level assert and no uncalled `check`
(`hidden_tests_problem`, asked by `TaskSpec.load_problem` where task files load): a task file
whose hidden tests are in HumanEval's `def check(candidate)` form is refused with one line naming
the field, instead of a task that every program solves. A `TaskSpec` that breaks the rule still
decodes: suites stored by earlier runs hold them (tests/contracts/test_stored_inputs.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from contracts.task import TaskSpec
from contracts.task_tests import hidden_tests_problem
from infra.sandbox.judge import split_tests
from infra.tasks.jsonl import read_jsonl

SHOWN = "def check(candidate):\n    assert candidate(1, 2) == 3\n"
CHECK_FORM = "def check(candidate):\n    assert candidate(40, 2) == 42\n"


def task(hidden: str) -> TaskSpec:
    return TaskSpec(
        id="add", prompt="Write add.", entry_point="add", tests=SHOWN, hidden_tests=hidden
    )


@pytest.mark.parametrize(
    ("hidden", "problem"),
    [
        ("", ""),
        ("assert add(40, 2) == 42\n", ""),
        ("x = 40\nassert add(x, 2) == 42\n", ""),
        ("def helper(a):\n    return add(a, 2)\nassert helper(40) == 42\n", ""),
        ("assert add(40, 2) == (42\n", ""),  # not Python: the checker fails every program on it
        (CHECK_FORM, "they define check(candidate), which nothing calls"),
        (CHECK_FORM + "assert add(1, 1) == 2\n", "they define check(candidate), which nothing"),
        (CHECK_FORM + "check(add)\n", "they hold no top-level assert"),
        ("add(40, 2)\n", "they hold no top-level assert"),
        ("\n", "they hold no top-level assert"),
    ],
)
def test_the_rule(hidden: str, problem: str) -> None:
    found = hidden_tests_problem(hidden)
    assert found.startswith(problem) and bool(found) is bool(problem), found
    assert task(hidden).hidden_tests == hidden  # decodes: a stored suite may hold it
    assert task(hidden).load_problem() == (f"hidden_tests: {found}" if problem else None)


def test_a_task_file_with_check_form_hidden_tests_is_refused(tmp_path: Path) -> None:
    """It loaded, and a wrong `add` (shown: candidate(1, 2) == 3; hidden: candidate(40, 2) == 42)
    passed 2/2: the hidden unit only defined `check`, which nothing called."""
    path = tmp_path / "tasks.jsonl"
    path.write_text(task("").model_copy(update={"hidden_tests": CHECK_FORM}).model_dump_json())
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(path))}:1: .*hidden_tests: they define check"
    ):
        read_jsonl(path)


@pytest.mark.parametrize(
    "text", ["-" * 200_000 + "1", "(" * 300_000, "assert 1\0"], ids=["deep", "parens", "nul"]
)
def test_text_past_the_parser_is_a_task_that_does_not_parse(text: str) -> None:
    """Nesting past the parser's stack raised MemoryError out of the check, in a task's
    workflow (which runs it at the start: workflows/agent_task.py), failing its workflow task on
    every retry; such text is one that does not parse, in the rules and in the host's count."""
    assert task(text).load_problem() is None  # left to the checker, which fails every program
    spec = TaskSpec(id="add", prompt="Write add.", entry_point="add", tests=text)
    assert spec.load_problem() is None and hidden_tests_problem(text) == ""
    assert split_tests(SHOWN, "add", text)[-1] == {
        "test": True,
        "line": 1,
        "source": text,
        "hidden": True,
    }
