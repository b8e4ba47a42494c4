"""The README's `temporal workflow start` example (section "Start a task without Python") is a
valid `AgentTaskInput`, with every field it shows taken as written: a user pastes it as is."""

from __future__ import annotations

import json
import re

from contracts.task import AgentTaskInput
from tests.paths import REPO_ROOT

EXAMPLE = re.compile(r"temporal workflow start .*?--input '(\{.*?\})'\n", re.S)


def test_the_readmes_start_example_is_a_valid_task_input() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    [text] = EXAMPLE.findall(readme)
    raw = json.loads(text.replace("'\"$RUN\"'", "demo-1"))  # the shell's splice of $RUN
    task = AgentTaskInput.model_validate(raw)
    assert task.model_dump(include=set(raw), exclude={"task"}) == {
        key: value for key, value in raw.items() if key != "task"
    }
    assert (task.run_id, task.policy_run) == ("demo-1", "demo")
