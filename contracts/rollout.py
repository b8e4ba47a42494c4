"""Contracts of a rollout: episode steps, the status query, GENERATE and trajectory writing.

An agent task is a GRPO group of G episodes (samples). Each episode is a list of steps; a step
is one model turn (GENERATE), the action it held run (EXECUTE) and its observation (FEEDBACK).
Everything here carries references; texts and token ids live in the store.
"""

import math

from pydantic import Field, field_validator

from contracts.common import Contract, ObjectRef, empty_left_out
from contracts.episode import EpisodeEnd, SessionRef, ToolCall, Verdict
from contracts.errors import ErrorType, fail
from contracts.sandbox import ExecStatus
from contracts.task import EnvName, SamplingParams, TaskSpec


class CompletionRecord(Contract):
    """`completion.json` of a step: exactly what was sampled, for the learner and for replay.

    A log-prob that is not finite is the inference engine's fault (a row it gave no log-prob
    for, a model that computed NaN), not the sample's, and JSON has no NaN: written as null, the
    record could not be read back by the next step, the trajectory writer or the learner. The
    rule is `infra.inference.nonfinite` (a random row is drawn again, a greedy or seeded one
    fails for good); `logprobs` here is the guard behind it: a record built with one anyway is
    refused as `ErrorType.INFERENCE`."""

    text: str
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float] = Field(description="Log-prob of each completion token when sampled.")
    logprob_temperature: float = Field(
        default=1.0,
        gt=0.0,
        le=2.0,
        description="The temperature `logprobs` were taken at (`SamplingParams."
        "logprob_temperature`); 1 in records written before it was recorded.",
    )
    policy_version: int
    finish_reason: str = "stop"
    started_at: str = ""
    finished_at: str = ""
    thinking: bool = Field(
        default=False,
        exclude_if=empty_left_out,  # records of the release before read it as False
        description="Its prompt opened a think block (`infra.inference.calltags."
        "starts_thinking`): the text is thinking up to its first `</think>`, as it was parsed.",
    )

    @field_validator("logprobs")
    @classmethod
    def _finite(cls, logprobs: list[float]) -> list[float]:
        # raised as it is (pydantic passes on what is not a ValueError): the activity that
        # builds the record fails with the enum's type, where a ValidationError has none
        for index, logprob in enumerate(logprobs):
            if not math.isfinite(logprob):
                raise fail(
                    ErrorType.INFERENCE,
                    f"logprobs[{index}] = {logprob}: the inference engine gave a log-prob that "
                    "is not finite for a sampled token; not stored (JSON has no NaN): rows are "
                    "drawn by infra/inference/nonfinite.py, which keeps these out",
                )
        return logprobs


class EpisodeStep(Contract):
    """One generate → execute → feedback step of one episode (references only)."""

    step: int = Field(ge=0)
    policy_version: int = Field(ge=0)
    completion: ObjectRef = Field(description="completion.json: text, token ids, logprobs.")
    code: ObjectRef | None = Field(default=None, description="`code`: the program run.")
    call: ToolCall | None = Field(default=None, description="`workspace`: the tool call.")
    num_tokens: int = Field(default=0, ge=0, description="Completion tokens.")
    prompt_tokens: int = Field(default=0, ge=0)
    observation: ObjectRef | None = Field(
        default=None,
        description="What the model is shown next: `code` the execution's result.json, "
        "`workspace` the tool's result text.",
    )
    status: ExecStatus | None = None
    tests_passed: int = 0
    tests_total: int = 0
    reward: float | None = Field(default=None, description="The episode's reward so far.")


class EpisodeState(Contract):
    """One episode (sample) of a group: its steps, its session, how it ended."""

    sample: int = Field(ge=0)
    steps: list[EpisodeStep] = []
    end: EpisodeEnd | None = Field(default=None, description="None while it still acts.")
    session: SessionRef | None = Field(default=None, description="`workspace`: its sandbox.")
    verdict: Verdict | None = Field(default=None, description="`workspace`: set at DONE.")
    solved: bool = False
    reward: float = 0.0


class TaskStatus(Contract):
    """Answer of the `status` query."""

    state: str
    turn: int = Field(description="The step the group is on.")
    policy_version: int | None = None
    samples: list[EpisodeState]
    aborted_reason: str | None = None


class AgentTaskResult(Contract):
    run_id: str
    task_id: str
    state: str
    turns: int = Field(description="Steps of the longest episode.")
    rewards: list[float]
    solved: list[bool]
    best_reward: float
    policy_versions: list[int] = Field(description="Policy version of each sample's last step.")
    trajectories: list[ObjectRef]
    aborted_reason: str | None = None
    steps: list[int] = Field(default=[], description="Steps each sample took.")
    ends: list[EpisodeEnd] = Field(default=[], description="How each sample's episode ended.")


class GenerateItem(Contract):
    """One episode to generate for. Step 0: nothing (the prompt is rendered from the task).
    Step k > 0: the previous step's completion record and its observation, both in the store;
    the prompt is the previous prompt and completion with the observation's tokens appended."""

    sample: int = Field(ge=0)
    previous: ObjectRef | None = Field(default=None, description="Previous CompletionRecord.")
    observation: ObjectRef | None = Field(default=None, description="Its observation.")


class GenerateRequest(Contract):
    run_id: str
    task_id: str
    turn: int = Field(ge=0, description="The step.")
    env: EnvName = EnvName.CODE
    prompt: str = Field(description="The task's instruction (rendered at step 0).")
    sampling: SamplingParams
    max_context_tokens: int = Field(
        default=1 << 20, ge=1, description="A prompt + max_new_tokens above this is not sampled."
    )
    policy_run: str = Field(description="Run whose published policies are sampled.")
    policy_version: int | None = Field(default=None, description="None = newest published.")
    items: list[GenerateItem]
    max_turns: int | None = Field(
        default=None,
        ge=1,
        description="The episode's turns, which a `workspace` prompt tells the model (None: "
        "an earlier build's request; the prompt tells no count).",
    )


class Completion(Contract):
    sample: int
    completion: ObjectRef
    code: ObjectRef | None = Field(default=None, description="`code`: code.py extracted.")
    call: ToolCall | None = Field(default=None, description="`workspace`: the parsed call.")
    num_tokens: int = 0
    prompt_tokens: int = 0
    finish_reason: str = "stop"
    policy_version: int | None = Field(
        default=None,
        description="The version that sampled it: an overlapping attempt's stored completion "
        "may be another version than the response's (None in histories from before).",
    )


class GenerateResponse(Contract):
    policy_version: int
    completions: list[Completion]
    over_budget: dict[int, int] = Field(
        default={},
        description="Sample → tokens of its next prompt, for samples not sampled because that "
        "prompt plus max_new_tokens exceeds max_context_tokens.",
    )
    tokens_per_s: float = 0.0


class WriteTrajectoriesRequest(Contract):
    """Write each episode's trajectory once (create-only, deterministic key)."""

    run_id: str
    task: TaskSpec
    group_size: int
    samples: list[EpisodeState]


class WriteTrajectoriesResponse(Contract):
    trajectories: list[ObjectRef]
    created: int = Field(description="How many were new (the rest already existed: a retry).")
