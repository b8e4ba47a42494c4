"""The built-in `basics` suite: 50 deterministic tool-use tasks (30 train, 20 held out) whose
stated action is the whole task: the reference solution (that action) scores 1.0 every time,
the untouched workspace less, and each family's action is one call of the tool its prompt names."""

from __future__ import annotations

import asyncio
from collections import Counter

from infra.environments.mounts import remove_tree
from infra.environments.tree import decode_tree
from infra.settings import SandboxSettings, Settings, WorkspaceSettings
from infra.tasks import is_workspace_suite, load_suite, load_workspace_suite
from infra.tasks.basics import FAMILIES, HELDOUT, basics_tasks
from infra.tasks.validate import CheckPlan
from infra.tasks.workspace_validate import validate_workspace_suite
from tests.infra.environments.conftest import needs_root, session_root


def test_the_suite_is_deterministic_split_and_loads_as_a_workspace_suite() -> None:
    tasks = basics_tasks()
    assert len(tasks) == 50 and len(FAMILIES) == 5
    assert Counter(task.spec.split for task in tasks) == {"train": 30, "heldout": 20}
    assert len({task.spec.id for task in tasks}) == 50
    again = basics_tasks.__wrapped__()  # rendered afresh from the seeds
    assert [t.spec for t in again] == [t.spec for t in tasks]
    assert is_workspace_suite("basics")
    assert [t.id for t in load_suite("basics", split="heldout")][:2] == [
        "basics-script-6",
        "basics-script-7",
    ]
    assert len(load_workspace_suite("basics", split="train")) == 30
    # held-out instances differ from the training ones (test_suites.py: their answers too)
    for family in FAMILIES:
        of = [t for t in tasks if t.spec.id.startswith(f"basics-{family}-")]
        assert len(of) == 6 + HELDOUT[family], family
        assert len({t.spec.prompt for t in of}) >= 6, family
        assert len({t.tests.ref.key for t in of}) == len(of), family


def test_each_prompt_states_its_action_and_the_tool_for_it() -> None:
    tools = {"script": "bash", "python": "bash", "rename": "bash"}
    for task in basics_tasks():
        family = task.spec.id.split("-")[1]
        solve = (task.spec.canonical_solution or "").removeprefix("#!/bin/sh\n").strip()
        assert f"`{tools.get(family, 'write_file')}` tool" in task.spec.prompt
        assert task.spec.prompt.endswith("call `submit`.")
        if family in ("write", "edit"):  # the prompt holds the file's exact text, on one line
            path, text = solve.removeprefix("cat > ").split(" <<'EOF'\n")
            assert f"the path `{path}` and the content `{text.removesuffix(chr(10) + 'EOF')}`" in (
                task.spec.prompt
            ), task.spec.id
        else:  # the prompt holds the exact command
            assert f"`{solve}`" in task.spec.prompt, (task.spec.id, solve)
        hidden = decode_tree(task.tests.objects[task.tests.ref.key])[1]
        assert sum(text.count(b"assert ") for text in hidden.values()) == 4


@needs_root
def test_every_task_validates() -> None:
    root = session_root()
    settings = Settings(sandbox=SandboxSettings(workspaces=WorkspaceSettings(root=root)))
    try:
        report = asyncio.run(validate_workspace_suite(settings, "basics", CheckPlan(1, 4)))
    finally:
        remove_tree(root)
    assert report.runs == 2 * 50
    assert {task.verdict for task in report.tasks} == {"clean"}
