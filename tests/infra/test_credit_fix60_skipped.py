"""Why a trajectory gave no gradient (`infra.learner_base.why_no_gradient`), true under either
credit: under "turn" equal rewards need not mean equal advantages, nor unequal ones a signal;
the reasons follow the plan's rows (infra/grpo_plan.py) and credit's one rule for flat."""

from __future__ import annotations

from contracts.learner import GRPOConfig
from contracts.trajectory import Trajectory
from infra import grpo_plan
from infra.learner_base import why_no_gradient
from tests.trajectories import Step, trajectory

EPISODE = GRPOConfig(max_staleness=10)


def turn(discount: float) -> GRPOConfig:
    return EPISODE.model_copy(update={"credit": "turn", "turn_discount": discount})


def episode(sample: int, reward: float, *reached: float) -> Trajectory:
    """Steps whose episode reward after each is `reached` (the last: `reward`)."""
    steps = [
        Step([1, 2] if k == 0 else [9], [10 + sample, 20 + k], reward=r)
        for k, r in enumerate([*reached, reward])
    ]
    return trajectory(steps, reward=reward, sample=sample)


def reasons(group: list[Trajectory], config: GRPOConfig) -> dict[str, str]:
    """The reason of every used trajectory the plan left without a row."""
    plan = grpo_plan.plan_step([group], 0, config, pad_id=0)
    rows = {r.trajectory_id for r in plan.rows}
    return {i: why_no_gradient(i, [group], config) for i in plan.used if i not in rows}


def test_equal_rewards_under_turn_credit_skip_only_what_ties_on_its_turns() -> None:
    # all scored 1.0, reached after turn 0: 0.0, 0.5, 1.0; turn 1's returns 1.0, 0.5, 0.0
    group = [episode(0, 1.0, 0.0), episode(1, 1.0, 0.5), episode(2, 1.0, 1.0)]
    assert reasons(group, turn(1.0)) == {
        "r.t.s1": "zero advantage: on each of its turns its return is the group's mean"
    }
    assert set(reasons(group, EPISODE).values()) == {
        "zero advantage: every sample of its group got the same reward"
    }


def test_a_group_tied_on_every_turn_says_so_whatever_its_rewards() -> None:
    # γ = 0: turn 0 gains -0.1 and -0.1; turn 1 reached by one episode alone
    group = [episode(0, -0.1), episode(1, -0.2, -0.1)]
    assert set(reasons(group, turn(0.0)).values()) == {
        "zero advantage: its group's returns are equal on every turn"
    }
    assert reasons(group, EPISODE) == {}


def test_rewards_apart_by_round_off_only_are_the_same_reward() -> None:
    group = [episode(0, -0.7), episode(1, -0.7000000000000001)]
    assert set(reasons(group, EPISODE).values()) == {
        "zero advantage: every sample of its group got the same reward"
    }
