"""The built-in suites keep the rules a task file's tasks are held to where they load
(`TaskSpec.load_problem`, asked by `infra.tasks.jsonl.parse_line`): they are code, not a file,
and `TaskSpec` itself no longer asks them (a suite stored by an earlier run must decode)."""

from __future__ import annotations

import pytest

from infra.tasks import BUILTIN_SUITES, load_suite


@pytest.mark.parametrize("suite", BUILTIN_SUITES)
def test_every_builtin_task_may_be_loaded(suite: str) -> None:
    problems = {task.id: task.load_problem() for task in load_suite(suite)}
    assert not {task: problem for task, problem in problems.items() if problem}
