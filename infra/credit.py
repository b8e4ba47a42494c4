"""Credit assignment: how a GRPO group's rewards become advantages on its episodes' tokens.

    per_token = token_advantages(group, credit="turn", discount=0.0)
    # one list per trajectory, aligned with its `token_ids`; 0 on every token not sampled

Two rules (`GRPOConfig.credit`), both against the group's own baseline (GRPO: no critic):
- "episode" (outcome reward, as single-turn GRPO in DeepSeekMath and TRL): every sampled token
  of episode i gets A_i = (r_i - mean r) / (std r + eps), r the episodes' rewards.
- "turn": turn t's tokens get the group advantage of the episode's return from turn t on,
  G_t = g_t + γ g_{t+1} + γ² g_{t+2} + … (g_k: what step k added to the episode's reward,
  γ = `turn_discount`), taken over the group's episodes that reached turn t (turn-level credit,
  as MT-GRPO). Turn 0's baseline includes the episodes that ended before their first step, as
  "episode" does.

What a turn is paid for, one rule under every γ: reward that came from no step of its own (the
context budget's charge for the turns an episode never took, `RewardConfig.score`'s
`cut_short_of`) comes at the turn the episode ended on: the last step it took, or turn 0 for an
episode that ended before its first step. Such an episode's return from turn 0 is therefore its
reward under any γ, as is that of an episode cut after its first step with the same reward.
Under γ = 1 a return is computed from the rewards reached, not summed from the steps' gains, so
G_0 is the episode's reward bit for bit (G_t: the reward minus that before turn t).

Flat, one rule (`flat`): a group's rewards, or its returns from one turn, give no advantage when
fewer than two or spread no wider than round-off (`contracts.learner.has_signal`): 0.1 · 7 and
7 · 0.1 failed
turns are one score. The rows, the step's token count (infra/grpo_plan.py) and the reasons a
trajectory gave no gradient (infra/learner_base.py) follow from it.

Why "turn" exists: in a `code` episode a failed attempt gets the test log and tries again, and
under "episode" a first attempt that failed takes the credit of the fix that followed it (the
default run's reward gives such an episode 0.9 of a first-turn solve's 1.0), so the first turn
is pushed towards code that fails. With γ = 0 each attempt is judged by its own outcome; with
γ = 1 each turn by all the reward still to come, which is what a `workspace` episode needs
(its reward arrives only with the verdict at the end: under γ = 0 its earlier tool calls would
learn nothing). Measured on three default runs: under "episode" 6–15% of the positive advantage
on first turns went to code that failed its tests; their held-out gains under "turn" (γ = 0)
were within the spread of the default's, which keeps "episode" (README, "Credit across turns").

Not covered: staleness weights and normalisation (infra/grpo.py), the loss itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from contracts.learner import Credit, has_signal
from contracts.trajectory import Trajectory


def flat(values: Sequence[float]) -> bool:
    """Whether a group's rewards (or its returns from one turn) give GRPO nothing to learn from:
    fewer than two, or all equal up to round-off (`contracts.learner.has_signal`)."""
    return not has_signal(values)


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """(r - mean) / (std + eps) over one group, std the unbiased sample std; all zeros when the
    group is `flat` (no signal, or one sample)."""
    if flat(rewards):
        return [0.0] * len(rewards)
    mean = math.fsum(rewards) / len(rewards)
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
    return [(r - mean) / (std + eps) for r in rewards]


def step_returns(trajectory: Trajectory, discount: float) -> list[float]:
    """The return from each step on: what the step added to the episode's reward, plus what each
    later step added, discounted by `discount` per step (1: the reward still to come).

    With c_k the episode's reward after step k (c_-1 = 0, the last the trajectory's reward R) and
    n steps, summed by parts: G_t = γ^(n-1-t)·R - c_(t-1) + (1-γ)·Σ_(t≤k<n-1) γ^(k-t)·c_k; under
    γ = 1 that is R - c_(t-1) exactly (a sum of the gains could miss R by an ulp)."""
    n = len(trajectory.steps)
    reached = [step.reward for step in trajectory.steps[:-1]]  # c_0 .. c_(n-2)
    returns = []
    final, between = trajectory.reward, 0.0  # γ^(n-1-t)·R and Σ_(t≤k<n-1) γ^(k-t)·c_k
    for t in reversed(range(n)):
        before = reached[t - 1] if t else 0.0
        returns.append(final - before + (1.0 - discount) * between)
        between = before + discount * between
        final *= discount
    return returns[::-1]


def turn_advantages(trajectories: Sequence[Trajectory], discount: float) -> list[list[float]]:
    """Per trajectory, one advantage per step (rule "turn"): each step's return against the
    returns of the same step in the group's episodes that reached it."""
    returns = [step_returns(t, discount) for t in trajectories]
    out: list[list[float]] = [[] for _ in trajectories]
    for turn in range(max((len(r) for r in returns), default=0)):
        reached = [i for i, r in enumerate(returns) if len(r) > turn]
        baseline = reached if turn else range(len(trajectories))  # turn 0: every episode
        # one that ended before its first step: its reward came at turn 0 (module docstring)
        values = [returns[i][turn] if returns[i] else trajectories[i].reward for i in baseline]
        for i, advantage in zip(baseline, group_advantages(values), strict=True):
            if len(returns[i]) > turn:
                out[i].append(advantage)
    return out


def token_advantages(
    trajectories: Sequence[Trajectory], credit: Credit, discount: float
) -> list[list[float]]:
    """Per trajectory, its advantage on each token, 0 where the policy did not sample it: under
    "episode" the episode's on all its sampled tokens, under "turn" each step's on its own
    (`TrajectoryStep.span`)."""
    if credit == "episode":
        per_episode = group_advantages([t.reward for t in trajectories])
        return [
            [a * m for m in t.loss_mask] for t, a in zip(trajectories, per_episode, strict=True)
        ]
    out = []
    for trajectory, advantages in zip(
        trajectories, turn_advantages(trajectories, discount), strict=True
    ):
        tokens = [0.0] * len(trajectory.token_ids)
        for step, advantage in zip(trajectory.steps, advantages, strict=True):
            start, end = step.span
            tokens[start:end] = [advantage] * (end - start)
        out.append([a * m for a, m in zip(tokens, trajectory.loss_mask, strict=True)])
    return out
