"""Turn credit's turn-0 baseline under every discount: an episode the context budget ended
before its first step enters it on the footing of the others (`infra/credit.py`'s docstring:
reward from no step of its own comes at the turn the episode ended on). A regression test: a
review read the rule as mixing two quantities under γ < 1, and it held before as it does now."""

from __future__ import annotations

import pytest

from contracts.task import RewardConfig
from contracts.trajectory import Trajectory
from infra.credit import step_returns, turn_advantages
from tests.trajectories import Step, trajectory

REWARD = RewardConfig()
MAX_TURNS = 7


def code_episode(rounds: list[bool], sample: int, cut: bool) -> Trajectory:
    """A `code` episode with these test rounds; `cut`: its next prompt did not fit the context
    budget, and its turns left count as failed."""
    steps = [
        Step([1, 2] if k == 0 else [5], [10 + sample, 4 + k], reward=REWARD.score(rounds[: k + 1]))
        for k in range(len(rounds))
    ]
    reward = REWARD.score(rounds, cut_short_of=MAX_TURNS if cut else None)
    return trajectory(steps, reward=reward, sample=sample)


@pytest.mark.parametrize("discount", [0.0, 0.5, 0.9, 1.0])
def test_an_episode_cut_before_its_first_step_is_in_turn_zero_as_one_cut_after_it(
    discount: float,
) -> None:
    solved = code_episode([True], 0, cut=False)
    three = code_episode([False, False, True], 2, cut=False)
    cut_after_turn_zero = code_episode([False], 1, cut=True)
    cut_before = trajectory([], reward=REWARD.score([], cut_short_of=MAX_TURNS), sample=3)
    assert cut_before.reward == cut_after_turn_zero.reward  # 7 failed rounds, one taken or none
    # the charge for the turns not taken lands on the turn that ended the episode, whatever γ
    assert step_returns(cut_after_turn_zero, discount) == [cut_after_turn_zero.reward]
    with_none = turn_advantages([solved, cut_after_turn_zero, three, cut_before], discount)
    with_one = turn_advantages(
        [solved, cut_after_turn_zero, three, cut_after_turn_zero.model_copy()], discount
    )
    assert [a[0] for a in with_none[:3]] == [a[0] for a in with_one[:3]]
    assert with_none[3] == [] and with_one[3] == with_one[1]
    # the turn-0 values really are discounted for an episode that went on (three turns)
    assert with_none[2][0] != with_none[1][0]
