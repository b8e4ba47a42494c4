"""Contracts of a rollout: turns, samples, the status query, GENERATE and trajectory writing."""

from pydantic import Field

from contracts.common import Contract, ObjectRef
from contracts.sandbox import ExecStatus
from contracts.task import SamplingParams, TaskSpec


class CompletionRecord(Contract):
    """`completion.json` of a turn: exactly what was sampled, for the learner and for replay."""

    text: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float] = Field(description="Log-prob of each completion token when sampled.")
    policy_version: int
    finish_reason: str = "stop"
    started_at: str = ""
    finished_at: str = ""


class TurnRecord(Contract):
    """One generate → execute → feedback round of one sample (references only)."""

    turn: int = Field(ge=0)
    policy_version: int = Field(ge=0)
    completion: ObjectRef  # completion.json: text, prompt/completion token ids, logprobs
    code: ObjectRef  # code.py extracted from the completion
    num_tokens: int = Field(default=0, ge=0)
    status: ExecStatus | None = None
    tests_passed: int = 0
    tests_total: int = 0
    result: ObjectRef | None = None  # result.json of the execution
    reward: float | None = None


class SampleState(Contract):
    sample: int = Field(ge=0)
    turns: list[TurnRecord] = []
    solved: bool = False
    reward: float = 0.0


class TaskStatus(Contract):
    """Answer of the `status` query."""

    state: str
    turn: int
    policy_version: int | None = None
    samples: list[SampleState]
    aborted_reason: str | None = None


class AgentTaskResult(Contract):
    run_id: str
    task_id: str
    state: str
    turns: int
    rewards: list[float]
    solved: list[bool]
    best_reward: float
    policy_versions: list[int] = Field(description="Policy version of each sample's last turn.")
    trajectories: list[ObjectRef]
    aborted_reason: str | None = None


class GenerateItem(Contract):
    """One sample to generate for; `history` are its earlier turns (their stored artefacts)."""

    sample: int = Field(ge=0)
    history: list[TurnRecord] = []


class GenerateRequest(Contract):
    run_id: str
    task_id: str
    turn: int = Field(ge=0)
    prompt: str
    sampling: SamplingParams
    policy_run: str = Field(description="Run whose published policies are sampled.")
    policy_version: int | None = Field(default=None, description="None = newest published.")
    items: list[GenerateItem]


class Completion(Contract):
    sample: int
    completion: ObjectRef
    code: ObjectRef
    num_tokens: int = 0
    finish_reason: str = "stop"


class GenerateResponse(Contract):
    policy_version: int
    completions: list[Completion]
    tokens_per_s: float = 0.0


class WriteTrajectoriesRequest(Contract):
    """Write each sample's trajectory once (create-only, deterministic key)."""

    run_id: str
    task: TaskSpec
    group_size: int
    samples: list[SampleState]


class WriteTrajectoriesResponse(Contract):
    trajectories: list[ObjectRef]
    created: int = Field(description="How many were new (the rest already existed: a retry).")
