"""A task's size bound: G episodes of `max_turns` steps, `group_size × max_turns` episode-steps at
most `MAX_GROUP_STEPS`, so its history stays within a quarter of Temporal's limits (what an
episode-step costs: tests/workflows/test_agent_task_history_bound.py).

Before, G=128 × 20 turns made a 9.4 MiB history; G=256 × 256 ran too (some 250 MiB: failed by
Temporal at 50 MiB, after hours of rollouts). The rule (`group_steps_problem`) refuses a new
run (`contracts.new_run`) and fails a new task at its start (tests/workflows/
test_agent_task_size.py); it is no validator of `AgentTaskInput`, whose stored inputs (tasks and
runs started before the bound) must still decode. Every preset, and the inputs the runtime builds
from them (training and held-out tasks), fit."""

from __future__ import annotations

import pytest

from contracts.task import MAX_GROUP_STEPS, AgentTaskInput, TaskSpec, group_steps_problem
from infra.presets import load_preset

TASK = TaskSpec(
    id="add", prompt="Write add.", entry_point="add", tests="def check(c):\n    assert c(1)\n"
)


def test_a_group_past_the_history_bound_is_a_problem_naming_its_shape() -> None:
    problem = group_steps_problem(128, 20)
    assert problem.startswith("group_size × max_turns = 128 × 20 = 2,560 episode-steps")
    assert f"at most {MAX_GROUP_STEPS:,}" in problem and "50 MiB" in problem
    stored = AgentTaskInput(task=TASK, group_size=128, max_turns=20)  # started before the bound
    assert AgentTaskInput.model_validate_json(stored.model_dump_json()) == stored


@pytest.mark.parametrize(
    ("group", "turns"),
    [(3, 256), (256, 3), (8, 96), (32, 24), (1, 256), (8, 50)],
)
def test_the_largest_groups_within_the_bound_fit(group: int, turns: int) -> None:
    """Shapes at the bound (G=3 × 256 turns and G=256 × 3, the largest, are measured by
    tests/workflows/test_agent_task_history_bound.py), a 50-step group of 8 (the issue's) and
    an evaluation's 256 turns of one."""
    assert group_steps_problem(group, turns) == ""


def test_just_past_the_bound_is_a_problem() -> None:
    assert MAX_GROUP_STEPS + 2 == 7 * 110  # 769 is prime
    assert f"= 770 episode-steps: at most {MAX_GROUP_STEPS:,}" in group_steps_problem(7, 110)


@pytest.mark.parametrize("preset", ["tiny", "smollm2", "agent"])
def test_every_preset_builds_task_inputs_that_fit(preset: str) -> None:
    run = load_preset(preset)
    assert run.new_run_problem() is None
    for task in (run.task_input(TASK, policy_version=0), run.eval_input(TASK, "r-eval-v0", 0)):
        assert group_steps_problem(task.group_size, task.max_turns) == ""
