"""`AgentTaskInput` refuses a group whose history would pass a quarter of Temporal's limits: G
episodes of `max_turns` steps, `group_size × max_turns` episode-steps at most
`MAX_GROUP_STEPS` (what an episode-step costs: tests/workflows/test_agent_task_history_bound.py).

Before, G=128 × 20 turns validated and made a 9.4 MiB history; G=256 × 256 validated too (some
250 MiB: failed by Temporal at 50 MiB, after hours of rollouts). Every preset, and the inputs
the runtime builds from them (training and held-out tasks), still validate."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from contracts.task import MAX_GROUP_STEPS, AgentTaskInput, TaskSpec
from infra.presets import load_preset
from workflows.agent_task import parse_task_input

TASK = TaskSpec(
    id="add", prompt="Write add.", entry_point="add", tests="def check(c):\n    assert c(1)\n"
)


def test_a_group_past_the_history_bound_is_refused_naming_its_shape() -> None:
    with pytest.raises(ValidationError) as refused:
        AgentTaskInput(task=TASK, group_size=128, max_turns=20)
    message = str(refused.value)
    assert "group_size × max_turns = 128 × 20 = 2,560" in message
    assert f"at most {MAX_GROUP_STEPS:,}" in message and "50 MiB" in message
    # a workflow started with it fails at once, naming the shape (not a retried task)
    with pytest.raises(Exception, match=r"invalid task: .*128 × 20 = 2,560"):
        parse_task_input({"task": TASK.model_dump(), "group_size": 128, "max_turns": 20})


@pytest.mark.parametrize(
    ("group", "turns"),
    [(3, 256), (256, 3), (8, 96), (32, 24), (1, 256), (8, 50)],
)
def test_the_largest_groups_within_the_bound_validate(group: int, turns: int) -> None:
    """Shapes at the bound (G=3 × 256 turns and G=256 × 3, the largest, are measured by
    tests/workflows/test_agent_task_history_bound.py), a 50-step group of 8 (the issue's) and
    an evaluation's 256 turns of one."""
    task = AgentTaskInput(task=TASK, group_size=group, max_turns=turns)
    assert task.group_size * task.max_turns <= MAX_GROUP_STEPS


def test_just_past_the_bound_is_refused() -> None:
    assert MAX_GROUP_STEPS + 2 == 7 * 110  # 769 is prime
    with pytest.raises(ValidationError, match=f"= 770 episode-steps: at most {MAX_GROUP_STEPS:,}"):
        AgentTaskInput(task=TASK, group_size=7, max_turns=110)


@pytest.mark.parametrize("preset", ["tiny", "smollm2", "agent"])
def test_every_preset_builds_valid_task_inputs(preset: str) -> None:
    run = load_preset(preset)
    run.task_input(TASK, policy_version=0)
    run.eval_input(TASK, f"{run.run_id}-eval-v0", 0)
