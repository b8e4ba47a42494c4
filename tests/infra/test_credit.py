"""Credit assignment (`infra/credit.py`) on hand-computed groups: returns per step, the per-turn
baselines, where each advantage lands in the token sequence, and what the learner's rows get."""

from __future__ import annotations

import pytest

from contracts.learner import GRPOConfig
from contracts.trajectory import Trajectory
from infra import grpo, grpo_plan
from infra.credit import group_advantages, step_returns, token_advantages, turn_advantages
from tests.trajectories import Step, trajectory


def episode(sample: int, *step_rewards: float) -> Trajectory:
    """A `code` episode: prompt [1, 2], then per step 2 sampled tokens and 1 observation token;
    `step_rewards` are the episode's reward after each step (the default run's: +1 solved,
    -0.1 a failed turn)."""
    steps = [
        Step([1, 2] if k == 0 else [9], [10 + k, 20 + k], reward=r)
        for k, r in enumerate(step_rewards)
    ]
    return trajectory(steps, reward=step_rewards[-1] if step_rewards else 0.0, sample=sample)


SOLVED_AT_ONCE, FIXED, FAILED_TWICE = (1.0,), (-0.1, 0.9), (-0.1, -0.2)
GROUP = [
    episode(0, *SOLVED_AT_ONCE),
    episode(1, *FIXED),
    episode(2, *FAILED_TWICE),
    episode(3, *FIXED),
]


def test_a_steps_return_is_what_it_and_the_discounted_later_steps_added() -> None:
    fixed = episode(0, *FIXED)  # the first turn added -0.1, the second +1.0
    assert step_returns(fixed, 0.0) == pytest.approx([-0.1, 1.0])
    assert step_returns(fixed, 1.0) == pytest.approx([0.9, 1.0])  # turn 0: the episode's reward
    assert step_returns(fixed, 0.5) == pytest.approx([-0.1 + 0.5, 1.0])
    assert step_returns(episode(0, *FAILED_TWICE), 0.0) == pytest.approx([-0.1, -0.1])
    assert step_returns(trajectory([], reward=0.3), 1.0) == []
    # the trajectory's reward, not its last step's, is what the episode finally got (a verdict)
    judged = trajectory([Step([1], [2], reward=0.0), Step([3], [4], reward=0.0)], reward=0.5)
    assert step_returns(judged, 1.0) == pytest.approx([0.5, 0.5])
    assert step_returns(judged, 0.0) == pytest.approx([0.0, 0.5])


def test_under_turn_credit_a_failed_first_attempt_is_not_paid_for_the_fix() -> None:
    by_episode = token_advantages(GROUP, "episode", 1.0)
    # "episode": rewards [1.0, 0.9, -0.2, 0.9]; the fixed episodes' failed first turns gain
    assert by_episode[1][2] > 0 and by_episode[1][2] == by_episode[1][5]
    per_turn = turn_advantages(GROUP, 0.0)
    # turn 0: [1.0, -0.1, -0.1, -0.1] against each other: the first attempt alone decides
    assert [a[0] for a in per_turn] == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    # turn 1: only the three that failed turn 0 reached it: [+1.0, -0.1, +1.0]
    assert [len(a) for a in per_turn] == [1, 2, 2, 2]
    second = group_advantages([1.0, -0.1, 1.0])
    assert [per_turn[1][1], per_turn[2][1], per_turn[3][1]] == pytest.approx(second)
    assert second[0] > 0 > second[1]


def test_turn_credit_undiscounted_gives_turn_zero_the_episodes_advantage() -> None:
    ended_before_its_first_step = trajectory([], reward=-0.2, sample=4)
    group = [*GROUP, ended_before_its_first_step]  # in turn 0's baseline, as under "episode"
    episodes = group_advantages([t.reward for t in group])
    turns = turn_advantages(group, 1.0)
    assert [a[0] for a in turns[:4]] == pytest.approx(episodes[:4])
    assert turns[4] == []


def test_each_advantage_lands_on_its_own_steps_sampled_tokens() -> None:
    per_turn = turn_advantages(GROUP, 0.0)
    tokens = token_advantages(GROUP, "turn", 0.0)
    fixed = GROUP[1]  # ids [1, 2, 10, 20, 9, 11, 21]: prompt, turn 0, observation, turn 1
    assert fixed.loss_mask == [0, 0, 1, 1, 0, 1, 1]
    first, second = per_turn[1]
    assert tokens[1] == pytest.approx([0, 0, first, first, 0, second, second])
    assert tokens[0] == pytest.approx([0, 0, per_turn[0][0], per_turn[0][0]])
    assert all(len(t) == len(g.token_ids) for t, g in zip(tokens, GROUP, strict=True))


def test_the_learners_rows_carry_the_configured_credit() -> None:
    config = GRPOConfig(credit="turn", turn_discount=0.0, max_staleness=10)
    rows = grpo.rows_from_group(GROUP, step=0, config=config).rows
    assert [r.advantages for r in rows] == token_advantages(GROUP, "turn", 0.0)
    default = grpo.rows_from_group(GROUP, step=0, config=GRPOConfig(max_staleness=10)).rows
    assert [r.advantages for r in default] == token_advantages(GROUP, "episode", 1.0)
    # rewards differ, but the episode the context budget ended after one failed turn ties
    # with the others on turn 0 and never reached turn 1: its row trains nothing, left out
    cut_short = episode(2, -0.1)
    plan = grpo_plan.plan_step(
        [[episode(0, *FIXED), episode(1, *FAILED_TWICE), cut_short]], 0, config, pad_id=0
    )
    assert [r.trajectory_id for r in plan.rows] == ["r.t.s0", "r.t.s1"]
    assert plan.used == ["r.t.s0", "r.t.s1", "r.t.s2"]


def test_a_group_with_one_sample_or_equal_returns_gets_no_advantage() -> None:
    assert turn_advantages([episode(0, *FIXED)], 0.0) == [[0.0, 0.0]]
    assert token_advantages([episode(0, *FIXED)], "turn", 0.0) == [[0.0] * 7]
    assert turn_advantages([], 0.0) == []
