"""Contracts of the learner side: policy versions, trajectory groups, train steps, training runs,
and the bounded state the learner and the training run carry through continue-as-new."""

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from contracts.common import Contract, Identifier, ObjectRef
from contracts.rollout import AgentTaskResult
from contracts.task import (
    AgentTaskInput,
    RewardConfig,
    SamplingParams,
    SandboxLimits,
    TaskSpec,
    eval_task_input,
)


class PolicyVersion(Contract):
    """A published policy: an HF causal-LM directory (its files are named by the version's
    manifest, `infra.policy`), or, when
    `adapter_of` is set, a PEFT LoRA adapter directory (adapter_config.json,
    adapter_model.safetensors, tokenizer files) over version `adapter_of` of the same run."""

    run_id: str
    version: int = Field(ge=0)
    prefix: str = Field(
        description="`<version prefix><digest of the files>/`: tells two publishes of a version "
        "apart (versions before content-addressed files stored them under it)."
    )
    step: int = Field(default=0, ge=0)
    created_at: str = ""
    adapter_of: int | None = Field(
        default=None, ge=0, description="A LoRA adapter over this full-weight version of the run."
    )


class TrajectoryGroup(Contract):
    """One finished agent task: its G trajectories, delivered to the learner by signal."""

    task_id: str
    trajectories: list[ObjectRef]
    rewards: list[float]
    policy_version: int = Field(ge=0, description="Oldest policy version in the group.")


class GRPOConfig(Contract):
    """How the learner turns groups into an update (GRPO with a clipped importance ratio)."""

    learning_rate: float = Field(default=1e-5, gt=0, le=1.0)
    """AdamW learning rate."""
    kl_coef: float = Field(default=0.0, ge=0.0, le=10.0)
    """Weight of the k3 KL estimate to the run's version 0; 0 disables it (no reference model)."""
    clip_eps: float = Field(default=0.2, gt=0.0, le=1.0)
    """PPO-style clip of the importance ratio to [1 − eps, 1 + eps]."""
    max_grad_norm: float = Field(default=1.0, gt=0.0, le=1000.0)
    """Gradients are clipped to this global norm."""
    zero_stage: int = Field(default=0, ge=0, le=3)
    """DeepSpeed ZeRO stage of the learner engine."""
    micro_batch_size: int = Field(default=4, ge=1, le=1024)
    """Sequences per forward/backward pass; gradients accumulate over a step's micro-batches."""
    groups_per_step: int = Field(default=4, ge=1, le=4096)
    """Finished groups (tasks) consumed by one learner step."""
    train_last_layers: int = Field(default=0, ge=0, le=1024)
    """Train only the last N decoder layers (and the head); 0 trains all of them."""
    max_staleness: int = Field(default=2, ge=0, le=1000)
    """How many versions a group's policy may lag the step that trains on it."""
    stale_policy: Literal["drop", "downweight"] = "drop"
    """What to do with a group older than `max_staleness`: drop it, or down-weight it."""
    lora_rank: int = Field(default=0, ge=0, le=256)
    """Rank of LoRA adapters trained instead of the full weights (PEFT, no dropout); 0 trains
    the full weights. Versions are then adapters over the run's full-weight version (megabytes
    each); the `vllm` backend serves ranks up to `inference.vllm.max_lora_rank`. Fixed for a run."""
    lora_alpha: int = Field(default=32, ge=1, le=4096)
    """LoRA scaling numerator: an adapter adds (lora_alpha / lora_rank) · B·A to each target."""
    lora_target_modules: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]] = Field(
        default=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1,
        max_length=64,
    )
    """Names of the linear modules that get an adapter (Llama-style projections by default);
    with `train_last_layers`, only those of the last N decoder layers."""


class PrepareRunRequest(Contract):
    """Publish policy version 0 of a run from a preset, a local HF dir or an S3 prefix."""

    run_id: Identifier
    base_model: str
    run: "TrainingRunInput | None" = Field(
        default=None, description="The run's input, stored once as runs/<run>/run.json."
    )


class TrainStepRequest(Contract):
    run_id: str
    step: int = Field(ge=0, description="Step index; produces policy version step + 1.")
    groups: list[TrajectoryGroup]
    config: GRPOConfig


class PolicyManifest(Contract):
    """`manifest.json` of a published version: what it is and every file with its digest."""

    policy: PolicyVersion
    files: dict[str, ObjectRef]


class StepRecord(Contract):
    """What made one policy version: `train_step.json` inside it, and the learner's ack
    (`runs/<run>/learner/step-<n>.json`), which lists every trajectory consumed."""

    run_id: str
    step: int
    attempt: str = Field(description="Id of the activity attempt whose weights these are.")
    groups: list[str] = Field(description="Task ids of the groups the step was asked to train.")
    loss: float
    trained: list[str] = Field(description="Trajectory ids whose tokens were in the update.")
    skipped: dict[str, str] = Field(
        default={}, description="Trajectory id → why it gave no gradient (e.g. zero advantage)."
    )
    dropped_stale: list[str] = Field(description="Trajectory ids dropped as too stale.")
    reward_mean: float
    duration_s: float
    metrics: dict[str, float] = {}
    policy: PolicyVersion | None = Field(default=None, description="Set in the ack only.")


class TrainStepResponse(Contract):
    policy: PolicyVersion
    loss: float
    trained: int = Field(description="Trajectories whose tokens were in the update.")
    skipped: int = Field(default=0, description="Trajectories that gave no gradient.")
    dropped_stale: int = 0
    reward_mean: float = 0.0
    duration_s: float = 0.0
    ack: ObjectRef = Field(description="Acknowledgement record: which trajectories were consumed.")


class HistoryBudget(Contract):
    """How much of Temporal's per-run history limits (51,200 events, 50 MiB) a long-lived
    workflow may use before it continues as new; the defaults are 20% of each."""

    events: int = Field(default=10_240, ge=200, le=51_200)
    """Continue as new before the run's history could pass this many events."""
    bytes: int = Field(default=10 * 1024 * 1024, ge=64 * 1024, le=50 * 1024 * 1024)
    """Continue as new before the run's history could pass this many bytes."""


class LedgerSegment(Contract):
    """What one continue-as-new segment of a `LearnerWorkflow` trained on, stored once at
    `keys.learner_ledger_key(run, segment)` (activity `record_ledger`): the learner's dedup set
    of every earlier segment, read back by `find_consumed`."""

    run_id: Identifier
    segment: int = Field(ge=0)
    first_step: int = Field(ge=0, description="First learner step of the segment.")
    next_step: int = Field(ge=0, description="First step of the next segment.")
    consumed: list[str] = Field(description="Task ids of the groups the segment's steps took.")


class FindConsumedRequest(Contract):
    """Which of `task_ids` a ledger segment `0 … segments − 1` of `run_id` lists."""

    run_id: Identifier
    segments: int = Field(ge=0, description="Segments written so far.")
    task_ids: list[str]


class FindConsumedResponse(Contract):
    consumed: list[str] = Field(description="Those of the asked ids an earlier segment took.")


class LearnerInput(Contract):
    """Input (and continue-as-new state) of `LearnerWorkflow`: constant in size. Task ids of
    earlier segments live in the ledger (`segment` segments written so far), steps in the acks;
    `pending` is bounded by the producer (the run's staleness gate and concurrency)."""

    run_id: Identifier
    config: GRPOConfig = GRPOConfig()
    max_steps: int = Field(default=10, ge=0)
    step: int = Field(default=0, ge=0)
    pending: list[TrajectoryGroup] = []
    consumed: list[str] = Field(
        default=[],
        description="Task ids trained on in this segment, not yet in the ledger (empty at the "
        "start of a segment; a run of the previous release carried all of them here).",
    )
    history: list[TrainStepResponse] = Field(
        default=[], description="The last `HISTORY_TAIL` steps (every step: the acks)."
    )
    finish_when_drained: bool = False
    parent_workflow_id: str | None = Field(default=None, description="Told of each step by signal.")
    heartbeat_timeout_s: float = Field(default=120.0, ge=1.0, le=3600)
    steps_per_run: int = Field(
        default=50, ge=1, description="Continue-as-new after this many steps."
    )
    segment: int = Field(default=0, ge=0, description="Ledger segments written so far.")
    budget: HistoryBudget = HistoryBudget()


class LearnerDone(Contract):
    """Signal `learner_done` from the learner to its training run: how it ended."""

    final: LearnerInput | None = Field(default=None, description="Its last state, if it ended.")
    error: str | None = Field(default=None, description="Why it failed, if it failed.")


class LearnerProgress(Contract):
    """Signal from the learner to its training run after each step."""

    step: int
    policy_version: int
    trained_groups: int
    reward_mean: float = 0.0
    loss: float = 0.0
    dropped_stale: int = 0
    staleness: int = Field(default=0, description="Versions between the oldest group and the step.")


class RunProgress(Contract):
    """Answer of `TrainingRunWorkflow`'s `progress` query."""

    tasks_started: int = Field(default=0, ge=0)
    tasks_done: int = Field(default=0, ge=0)
    in_flight: int = Field(default=0, ge=0)
    learner: list[LearnerProgress] = Field(
        default=[], description="The last `PROGRESS_TAIL` learner steps, oldest first."
    )
    evals: list["EvalResult"] = Field(default=[], description="Held-out evaluations so far.")
    stopping: str | None = Field(
        default=None, description="Told to stop (`stop`): why. It starts no more tasks."
    )


class LoadTasksRequest(Contract):
    suite: str
    skip_quarantined: bool = True


class LoadTasksResponse(Contract):
    train: list[TaskSpec]
    heldout: list[TaskSpec]
    quarantined: list[str] = []


def spread(tasks: Sequence[TaskSpec], limit: int) -> list[TaskSpec]:
    """`limit` of `tasks` evenly spaced over the list (all of them when `limit` is 0 or at least
    their number): a suite listed family by family keeps every family."""
    if limit <= 0 or limit >= len(tasks):
        return list(tasks)
    return [tasks[i * len(tasks) // limit] for i in range(limit)]


class EvalResult(Contract):
    """Held-out figures of one policy version: one greedy episode per held-out task, up to the
    run's `max_turns` turns, through the same pipeline as training."""

    policy_version: int
    pass_at_1: float = Field(description="Share of tasks solved at the first turn.")
    tasks: int
    solve_rate: float | None = Field(
        default=None, description="Share of tasks solved within `turns` turns (None: not run)."
    )
    turns: int = Field(default=1, ge=1, description="The turns each episode could take.")

    @classmethod
    def of(cls, version: int, results: Sequence[AgentTaskResult], turns: int) -> "EvalResult":
        """The figures of one greedy episode (G = 1) per held-out task, up to `turns` turns."""
        first_turn = sum(1 for r in results if r.solved[0] and r.turns == 1)
        solved = sum(1 for r in results if r.solved[0])
        count = len(results)
        return cls(
            policy_version=version,
            pass_at_1=first_turn / count,
            solve_rate=solved / count,
            tasks=count,
            turns=turns,
        )


class TrainingRunInput(Contract):
    """Input of `TrainingRunWorkflow` (what `tempered train` starts)."""

    run_id: Identifier
    suite: str = "starter"
    base_model: str = "tiny"
    steps: int = Field(default=3, ge=1, le=100000)
    group_size: int = Field(default=4, ge=1, le=256)
    max_turns: int = Field(default=2, ge=1, le=256, description="Steps per episode at most.")
    max_context_tokens: int = Field(
        default=4096, ge=64, le=1 << 20, description="Context budget of an episode (tokens)."
    )
    concurrency: int = Field(
        default=8,
        ge=1,
        le=2000,
        description="Agent tasks in flight (Temporal allows a workflow 2,000 pending children).",
    )
    eval_every: int = Field(
        default=0, ge=0, description="Held-out eval every N steps; 0 = ends only."
    )
    heldout_limit: int = Field(
        default=0,
        ge=0,
        description="Held-out tasks each eval runs: 0 = all of the suite's; N = N of them spread "
        "evenly over the suite's held-out list (`spread`), the same N at every eval.",
    )
    time_budget_s: float = Field(default=0, ge=0, description="Stop after this long; 0 = none.")
    sampling: SamplingParams = SamplingParams()
    eval_sampling: SamplingParams = SamplingParams(temperature=0.0)
    reward: RewardConfig = RewardConfig()
    limits: SandboxLimits = SandboxLimits()
    grpo: GRPOConfig = GRPOConfig()
    heartbeat_timeout_s: float = Field(default=30.0, ge=1.0, le=3600)
    seed: int = Field(default=0, description="Seeds the order in which training tasks are drawn.")
    budget: HistoryBudget = HistoryBudget()
    resume: "RunResume | None" = Field(
        default=None, description="Set by the run itself when it continues as new."
    )

    def eval_input(self, task: TaskSpec, eval_run: str, version: int) -> AgentTaskInput:
        """The held-out rollout of `task` by policy `version`, with this run's settings."""
        return eval_task_input(
            task,
            run_id=eval_run,
            policy_run=self.run_id,
            policy_version=version,
            sampling=self.eval_sampling,
            limits=self.limits,
            max_turns=self.max_turns,
            max_context_tokens=self.max_context_tokens,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
        )


class RunResume(Contract):
    """Where a `TrainingRunWorkflow` continues after continue-as-new: constant in size (the
    suite, counters, bounded tails). No agent task is in flight at that moment (the run drains
    them first); the learner lives on (a child that outlives its parent's runs)."""

    tasks: LoadTasksResponse
    started: int = Field(ge=0, description="Training tasks started so far (the next index).")
    done: int = Field(ge=0)
    progress: list[LearnerProgress] = Field(description="The last `PROGRESS_TAIL` steps.")
    evals: list[EvalResult] = Field(description="The first and the last `EVAL_TAIL` evals.")
    deadline: datetime | None = Field(description="When the time budget ends (None: never).")
    segment: int = Field(ge=1, description="Runs of this workflow before this one.")
    stopped: str | None = Field(
        default=None, description="Why the run was told to stop starting tasks (`stop`)."
    )


class TrainingRunResult(Contract):
    run_id: str
    steps: int
    tasks_started: int
    tasks_done: int
    history: list[TrainStepResponse] = Field(
        description="The last `HISTORY_TAIL` steps (every step: the acks in the store)."
    )
    evals: list[EvalResult]
    stopped: str | None = Field(
        default=None, description="Why the run ended before its steps: the `stop` signal's reason."
    )


PrepareRunRequest.model_rebuild()
RunProgress.model_rebuild()
TrainingRunInput.model_rebuild()
