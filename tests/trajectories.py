"""Format-2 trajectories built by hand, for tests of the learner, the CLI and regrade.

    trajectory(steps=[Step([1, 5], [7, 8]), Step([9], [6])], reward=1.0)

Each `Step` adds `added` tokens (the prompt at step 0; the end of turn and observation after)
and then its `completion`, which the mask marks as sampled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts.episode import EpisodeEnd
from contracts.sandbox import ExecStatus
from contracts.trajectory import Trajectory, TrajectoryStep, trajectory_id


@dataclass
class Step:
    added: list[int]
    completion: list[int]
    logprobs: list[float] | None = None  # default: -1.0 per completion token
    policy_version: int = 0
    code: str = ""
    status: ExecStatus = ExecStatus.FAILED
    reward: float | None = None  # the episode's reward after this step (default: its final one)


def trajectory(
    steps: Sequence[Step],
    *,
    reward: float = 0.0,
    run_id: str = "r",
    task_id: str = "t",
    sample: int = 0,
    group_size: int = 4,
    solved: bool | None = None,
    end: EpisodeEnd = EpisodeEnd.STEP_BUDGET,
    created_at: str = "",
    prompt: str = "p",
) -> Trajectory:
    token_ids: list[int] = []
    loss_mask: list[int] = []
    logprobs: list[float] = []
    records = []
    for k, step in enumerate(steps):
        sampled = step.logprobs if step.logprobs is not None else [-1.0] * len(step.completion)
        token_ids += step.added
        loss_mask += [0] * len(step.added)
        logprobs += [0.0] * len(step.added)
        start = len(token_ids)
        token_ids += step.completion
        loss_mask += [1] * len(step.completion)
        logprobs += sampled
        records.append(
            TrajectoryStep(
                step=k,
                policy_version=step.policy_version,
                span=(start, len(token_ids)),
                completion_text=step.code,
                code=step.code,
                status=step.status,
                reward=reward if step.reward is None else step.reward,
            )
        )
    return Trajectory(
        id=trajectory_id(run_id, task_id, sample),
        run_id=run_id,
        task_id=task_id,
        sample=sample,
        group_size=group_size,
        prompt=prompt,
        token_ids=token_ids,
        loss_mask=loss_mask,
        logprobs=logprobs,
        steps=records,
        end=end,
        reward=reward,
        solved=reward > 0 if solved is None else solved,
        policy_version=steps[-1].policy_version if steps else 0,
        created_at=created_at,
    )
