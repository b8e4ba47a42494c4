"""One rule for a flat group, whatever the credit: rewards or returns that differ by round-off
only give no advantage, no row and no share of the step's token count (`infra/credit.py`)."""

from __future__ import annotations

from contracts.learner import GRPOConfig
from contracts.task import RewardConfig
from contracts.trajectory import Trajectory
from infra import grpo_plan
from infra.credit import flat, group_advantages, step_returns, token_advantages
from tests.trajectories import Step, trajectory

REWARD = RewardConfig()
TURN = GRPOConfig(credit="turn", turn_discount=1.0, max_staleness=10)


def failing(turns: int, sample: int, max_turns: int = 7) -> Trajectory:
    """A `code` episode that failed `turns` rounds and was then cut by the context budget (its
    turns left count as failed: every such episode scores `failed_turn * max_turns`)."""
    rounds = [False] * turns
    steps = [
        Step([1, 2] if k == 0 else [5], [10 + sample, 4 + k], reward=REWARD.score(rounds[: k + 1]))
        for k in range(turns)
    ]
    reward = REWARD.score(rounds, cut_short_of=max_turns)
    return trajectory(steps, reward=reward, sample=sample, task_id="flat")


def real_group() -> list[Trajectory]:
    """A one-turn group with a signal: 4 sampled tokens in all."""
    return [
        trajectory([Step([1, 2], [3, 4])], reward=1.0, sample=0, task_id="real"),
        trajectory([Step([1, 2], [5, 4])], reward=0.0, sample=1, task_id="real"),
    ]


def test_undiscounted_turn_zero_return_is_the_episodes_reward_exactly() -> None:
    for max_turns in range(1, 9):
        for turns in range(1, max_turns + 1):
            for solved in (False, True):
                rounds = [False] * (turns - 1) + [solved]
                steps = [Step([1], [2], reward=REWARD.score(rounds[: k + 1])) for k in range(turns)]
                cut = None if solved else max_turns
                episode = trajectory(steps, reward=REWARD.score(rounds, cut_short_of=cut))
                returns = step_returns(episode, 1.0)
                assert returns[0] == episode.reward, (max_turns, turns, solved)
                # from turn t on: what the episode got beyond its reward before turn t
                for t in range(1, turns):
                    assert returns[t] == episode.reward - episode.steps[t - 1].reward


def test_equal_rewards_cut_after_different_turns_are_flat_under_turn_credit() -> None:
    one, three = failing(1, sample=0), failing(3, sample=1)
    assert one.reward == three.reward == REWARD.score([], cut_short_of=7)
    assert not any(any(a) for a in token_advantages([one, three], "turn", 1.0))
    alone = grpo_plan.plan_step([real_group()], 0, TURN, pad_id=0)
    both = grpo_plan.plan_step([real_group(), [one, three]], 0, TURN, pad_id=0)
    assert [r.trajectory_id for r in both.rows] == [r.trajectory_id for r in alone.rows]
    assert [r.scale for r in both.rows] == [r.scale for r in alone.rows] == [0.25, 0.25]
    assert sorted(both.used) == sorted([*alone.used, one.id, three.id])


def test_values_apart_by_round_off_only_are_flat() -> None:
    tied = [-0.7, -0.7000000000000001]  # 0.1 * 7 and 7 * 0.1 failed turns
    assert tied[0] != tied[1] and flat(tied) and group_advantages(tied) == [0.0, 0.0]
    assert flat([1e6, 1e6 + 1e-4]) and not flat([1e6, 1e6 + 1e-2])  # relative past 1
    assert not flat([0.0, 1e-8]) and any(group_advantages([0.0, 1e-8]))
    assert flat([0.3]) and flat([]) and not flat([0.0, 1.0])
    episode = GRPOConfig(max_staleness=10)
    near = [
        trajectory([Step([1, 2], [3, 4])], reward=r, sample=s, task_id="near")
        for s, r in enumerate(tied)
    ]
    alone = grpo_plan.plan_step([real_group()], 0, episode, pad_id=0)
    both = grpo_plan.plan_step([real_group(), near], 0, episode, pad_id=0)
    assert [r.trajectory_id for r in both.rows] == [r.trajectory_id for r in alone.rows]
    assert [r.scale for r in both.rows] == [0.25, 0.25]
