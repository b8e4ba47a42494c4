"""Contracts of the learner side: policy versions, trajectory groups, train steps, training runs."""

from typing import Literal

from pydantic import Field

from contracts.common import Contract, Identifier, ObjectRef
from contracts.task import RewardConfig, SamplingParams, SandboxLimits, TaskSpec


class PolicyVersion(Contract):
    """A published policy: an HF causal-LM directory stored under `prefix`."""

    run_id: str
    version: int = Field(ge=0)
    prefix: str = Field(description="Key prefix of the HF directory (config, tokenizer, weights).")
    step: int = Field(default=0, ge=0)
    created_at: str = ""


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


class LearnerInput(Contract):
    """Input (and continue-as-new state) of `LearnerWorkflow`."""

    run_id: Identifier
    config: GRPOConfig = GRPOConfig()
    max_steps: int = Field(default=10, ge=0)
    step: int = Field(default=0, ge=0)
    pending: list[TrajectoryGroup] = []
    consumed: list[str] = Field(default=[], description="Task ids already trained on.")
    history: list[TrainStepResponse] = []
    finish_when_drained: bool = False
    parent_workflow_id: str | None = Field(default=None, description="Told of each step by signal.")
    heartbeat_timeout_s: float = Field(default=120.0, ge=1.0, le=3600)
    steps_per_run: int = Field(
        default=50, ge=1, description="Continue-as-new after this many steps."
    )


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
    learner: list[LearnerProgress] = Field(default=[], description="One entry per learner step.")
    evals: list["EvalResult"] = Field(default=[], description="Held-out evaluations so far.")


class LoadTasksRequest(Contract):
    suite: str
    skip_quarantined: bool = True


class LoadTasksResponse(Contract):
    train: list[TaskSpec]
    heldout: list[TaskSpec]
    quarantined: list[str] = []


class EvalResult(Contract):
    """Held-out pass@1 of one policy version (greedy, one turn, through the same pipeline)."""

    policy_version: int
    pass_at_1: float
    tasks: int


class TrainingRunInput(Contract):
    """Input of `TrainingRunWorkflow` (what `tempered train` starts)."""

    run_id: Identifier
    suite: str = "starter"
    base_model: str = "tiny"
    steps: int = Field(default=3, ge=1, le=100000)
    group_size: int = Field(default=4, ge=1, le=256)
    max_turns: int = Field(default=2, ge=1, le=32)
    concurrency: int = Field(default=8, ge=1, le=100000, description="Agent tasks in flight.")
    eval_every: int = Field(
        default=0, ge=0, description="Held-out eval every N steps; 0 = ends only."
    )
    time_budget_s: float = Field(default=0, ge=0, description="Stop after this long; 0 = none.")
    sampling: SamplingParams = SamplingParams()
    eval_sampling: SamplingParams = SamplingParams(temperature=0.0)
    reward: RewardConfig = RewardConfig()
    limits: SandboxLimits = SandboxLimits()
    grpo: GRPOConfig = GRPOConfig()
    heartbeat_timeout_s: float = Field(default=30.0, ge=1.0, le=3600)
    seed: int = Field(default=0, description="Seeds the order in which training tasks are drawn.")


class TrainingRunResult(Contract):
    run_id: str
    steps: int
    tasks_started: int
    tasks_done: int
    history: list[TrainStepResponse]
    evals: list[EvalResult]


PrepareRunRequest.model_rebuild()
RunProgress.model_rebuild()
