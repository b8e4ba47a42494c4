"""The stored trajectory document (`runs/<run>/trajectories/<task>--s<sample>.json`), version 2.

Written once by the rewards worker when an agent task reaches DONE; read by the learner and by
`tempered regrade`, which writes a `RewardRecord` per trajectory beside it.

One token sequence per episode, exactly as the policy saw and sampled it (never re-tokenized):
`token_ids` is the last step's prompt followed by its completion, and since each step's prompt
is the previous prompt + completion + template and observation tokens, it holds every step.
`loss_mask[i]` is 1 where token i was sampled by the policy and 0 for prompt, observation and
template tokens; `logprobs[i]` is the sampled log-prob where the mask is 1, else 0. Each step
records where its completion lies in the sequence (`span`) and what it did.
"""

from typing import Literal

from pydantic import Field, model_validator

from contracts.common import Contract, ObjectRef
from contracts.episode import EpisodeEnd, ToolCall
from contracts.sandbox import ExecStatus
from contracts.task import EnvName


class TrajectoryStep(Contract):
    step: int = Field(ge=0)
    policy_version: int = Field(ge=0)
    span: tuple[int, int] = Field(description="[start, end) of its completion in `token_ids`.")
    completion_text: str
    finish_reason: str = "stop"
    code: str | None = Field(default=None, description="`code`: the program that ran.")
    call: ToolCall | None = Field(default=None, description="`workspace`: the tool call.")
    observation: ObjectRef | None = Field(default=None, description="What the model was shown.")
    status: ExecStatus | None = None
    tests_passed: int = 0
    tests_total: int = 0
    reward: float = Field(default=0.0, description="The episode's reward after this step.")
    started_at: str = ""
    finished_at: str = ""


class Trajectory(Contract):
    format_version: Literal[2] = 2
    id: str = Field(description="`<run>.<task>.s<sample>`; deterministic, so a rewrite is a no-op.")
    run_id: str
    task_id: str
    sample: int
    group_size: int
    env: EnvName = EnvName.CODE
    prompt: str
    token_ids: list[int]
    loss_mask: list[int] = Field(description="1: sampled by the policy; 0: prompt, observation.")
    logprobs: list[float] = Field(description="Sampled log-prob where the mask is 1, else 0.")
    logprob_temperature: float = Field(
        default=1.0,
        gt=0.0,
        le=2.0,
        description="The temperature every step's `logprobs` were taken at, which the learner "
        "recomputes them at (one per episode); 1 in trajectories written before it was recorded.",
    )
    steps: list[TrajectoryStep]
    end: EpisodeEnd
    reward: float
    solved: bool
    verifier: ObjectRef | None = Field(
        default=None, description="`workspace`: the verifier's full result at DONE."
    )
    policy_version: int = Field(description="Version that generated the last step.")
    created_at: str

    @model_validator(mode="after")
    def _aligned(self) -> "Trajectory":
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"token_ids ({n}), loss_mask ({len(self.loss_mask)}) and logprobs "
                f"({len(self.logprobs)}) must be aligned"
            )
        return self

    @property
    def oldest_policy_version(self) -> int:
        return min((s.policy_version for s in self.steps), default=self.policy_version)


class RewardRecord(Contract):
    """One regrade of one trajectory (`runs/<run>/rewards/<grader>/<task>--s<sample>.json`)."""

    trajectory_id: str
    grader: str
    suite: str
    status: ExecStatus
    tests_passed: int = Field(default=0, ge=0)
    tests_total: int = Field(default=0, ge=0)
    solved: bool
    reward: float
    previous_solved: bool
    previous_reward: float
    detail: str = Field(default="", description="Tail of stderr when the program failed.")


def trajectory_id(run_id: str, task_id: str, sample: int) -> str:
    return f"{run_id}.{task_id}.s{sample}"
