"""Contracts of the learner side: policy versions, trajectory groups, train steps, the ledger,
and the bounded state the learner carries through continue-as-new. The training run's own
contracts (its input, evaluations, progress and result) are in contracts/run.py."""

import math
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import Field

from contracts.common import (
    Contract,
    Identifier,
    InputContract,
    ObjectRef,
    SignalPayload,
    empty_left_out,
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


FLAT_SPREAD = 1e-9
"""Values whose max - min is at most this times max(1, |mean|) are one value (round-off, as
in 0.1 · 7 against 7 · 0.1): GRPO normalises by their spread, so it would otherwise turn a
difference of one ulp into advantages of ±1e-10 and count the group's tokens in the step."""


def has_signal(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards (or its returns from one turn) give GRPO anything to learn
    from: two or more that differ by more than round-off (`FLAT_SPREAD`; a flat group's
    advantages are all zero, so it trains nothing, and the run redraws it)."""
    if len(rewards) < 2 or max(rewards) == min(rewards):
        return False
    mean = math.fsum(rewards) / len(rewards)
    return max(rewards) - min(rewards) > FLAT_SPREAD * max(1.0, abs(mean))


class TrajectoryGroup(SignalPayload):
    """One finished agent task: its G trajectories, delivered to the learner by signal
    (`add_groups`)."""

    task_id: str
    trajectories: list[ObjectRef]
    rewards: list[float]
    policy_version: int = Field(ge=0, description="Oldest policy version in the group.")


Credit = Literal["episode", "turn"]
"""How a group's rewards become its episodes' advantages (`GRPOConfig.credit`)."""


class GRPOConfig(InputContract):
    """How the learner turns groups into an update (GRPO with a clipped importance ratio)."""

    learning_rate: float = Field(default=1e-5, gt=0, le=1.0)
    """AdamW learning rate."""
    kl_coef: float = Field(default=0.0, ge=0.0, le=10.0)
    """Weight of the k3 KL estimate to the run's version 0; 0 disables it (no reference model)."""
    clip_eps: float = Field(default=0.2, gt=0.0, le=1.0)
    """PPO-style clip of the importance ratio to [1 − eps, 1 + eps]."""
    credit: Credit = "episode"
    """Which advantage an episode's turns get (infra/credit.py): "episode", the episode's reward
    against its group's (every turn alike, as single-turn GRPO); "turn", each turn's return
    (what it and the turns after it added, discounted by `turn_discount`) against the group's
    episodes that reached that turn, so that a failed attempt is not credited with the fix a
    later turn made."""
    turn_discount: float = Field(default=1.0, ge=0.0, le=1.0)
    """With `credit = "turn"`: the weight of the next turn's reward in a turn's return (0: a turn
    is judged by its own outcome; 1: by all the reward still to come, which an episode rewarded
    only at its end needs)."""
    epochs: int = Field(default=1, ge=1, le=16)
    """Optimizer updates per step over the same groups (GRPO's μ, PPO's epochs; TRL's
    `num_iterations`): each runs every pass again on the weights the previous one left, and the
    clipped ratio to the sampling policy bounds how far they move. One version is published per
    step whatever this is; a step's learner time grows with it."""
    max_grad_norm: float = Field(default=1.0, gt=0.0, le=1000.0)
    """Gradients are clipped to this global norm."""
    zero_stage: int = Field(default=0, ge=0, le=3)
    """DeepSpeed ZeRO stage of the learner engine."""
    micro_batch_size: int = Field(default=4, ge=1, le=1024)
    """Sequences per forward/backward pass; gradients accumulate over a step's micro-batches."""
    micro_batch_tokens: int = Field(default=0, ge=0, le=10_000_000)
    """At most this many padded tokens per forward (rows × longest row; a longer row goes
    alone); 0 bounds only the rows. On a CPU a forward slows sharply past a few thousand tokens
    (SmolLM2-135M, 2 cores: 8 × 600 tokens train at half the tokens/s of 2 × 600)."""
    share_prompt: bool | None = None
    """Run each group's prompt once per pass and continue every sample from its keys and values
    (`infra.learner_forward`); false runs every sample whole. The same update within float
    error. True is refused (the run's `config`, never retried) for a model whose cache cannot
    hold a prompt whole (sliding-window attention: Mistral, Gemma) and with ZeRO-3 on several
    ranks. None (the default) shares where the learner runs on a CPU and not on a GPU
    (`shares_prompt`), and never for such a model (`infra.learner_forward.sharing`):
    bench/learner.py, the default run's step, shared vs whole: 9.84 vs 13.97 s on 2 CPU cores
    (a third fewer tokens computed), 0.81 vs 0.28 s on one H200 (a group's several small
    forwards cost more there than one larger one)."""
    groups_per_step: int = Field(default=4, ge=1, le=4096)
    """Finished groups (tasks) consumed by one learner step."""
    train_last_layers: int = Field(default=0, ge=0, le=1024)
    """Train only the last N decoder layers, the final norm and an untied LM head (a head tied to
    the embeddings stays frozen with them, even where N covers every layer); 0 trains every
    parameter (`infra.learner_model.train_only_last_layers`)."""
    max_staleness: int = Field(default=2, ge=0, le=1000)
    """How many versions a group's policy may lag the step that trains on it."""
    stale_policy: Literal["drop", "downweight"] = "drop"
    """What to do with a group older than `max_staleness`: drop it, or down-weight it."""
    redraw_flat_groups: int = Field(default=0, ge=0, le=1_000_000)
    """Dynamic sampling (DAPO): the run may start up to this many extra tasks in place of flat
    groups (all rewards equal, `has_signal` false), which it then does not send to the learner,
    so each step trains on `groups_per_step` groups that carry a signal; 0 sends every group.
    Spread over the run's steps (`contracts.run.redraws_allowed`)."""
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

    def new_run_problem(self) -> str | None:
        """Why a new run may not train with these settings (None: it may). Asked where a run is
        built (`infra.presets.load_preset`), not when a stored input is read: runs of earlier
        releases that set these must still decode (their histories replay)."""
        if self.redraw_flat_groups and self.credit == "turn" and self.turn_discount < 1:
            # a flat group is judged by its episodes' rewards (`has_signal`); discounted turn
            # credit gives equal rewards reached in different numbers of turns a signal
            return (
                "redraw_flat_groups with credit = 'turn' and turn_discount < 1: a group whose "
                "episodes scored alike in different numbers of turns carries a signal, yet would "
                "be redrawn as flat; set redraw_flat_groups = 0 or turn_discount = 1"
            )
        return None

    def shares_prompt(self, device: str, ranks: int = 1) -> bool:
        """Whether a learner of `ranks` ranks on torch `device` runs each group's prompt once
        (`share_prompt`). Never under ZeRO-3 on several ranks: a shared pass makes as many
        forwards as its batches, which differ between ranks, and ZeRO-3 gathers the weights in
        every forward (the ranks' collectives would no longer pair up)."""
        split = self.zero_stage == 3 and ranks > 1
        if self.share_prompt and split:
            raise ValueError(
                f"share_prompt with ZeRO-3 on {ranks} ranks: each rank would gather the weights "
                "a different number of times; set share_prompt to false (or leave it unset)"
            )
        if self.share_prompt is not None:
            return self.share_prompt
        return device.startswith("cpu") and not split


class TrainStepRequest(Contract):
    """Train step `step` on its groups: inline in `groups` or, where they would pass a payload
    (`workflows/learner_request.py`), stored in parts named by `group_parts` (none inline); the
    step's groups are `groups`, then each part's, in order."""

    run_id: str
    step: int = Field(ge=0, description="Step index; produces policy version step + 1.")
    groups: list[TrajectoryGroup]
    config: GRPOConfig
    group_parts: list[ObjectRef] = Field(
        default=[],
        description="Stored `StepGroups` of this step (`store_step_groups`). Left out of the "
        "payload when empty (`empty_left_out`): an inline request is the previous release's.",
        exclude_if=empty_left_out,
    )


class StepGroups(Contract):
    """One part of a learner step's groups, stored by `store_step_groups` at
    `keys.learner_step_groups_key` (create-only, named by its digest) and named in the step's
    `TrainStepRequest.group_parts`: a step's groups travel by reference where they would pass
    a payload (G = 256: ~45 KB a group, 2 MiB at ~47 groups). So do the groups pending at step
    `step` that a learner's state hands on (`LearnerInput.pending_parts`, read back by
    `load_step_groups`)."""

    run_id: str
    step: int = Field(ge=0)
    groups: list[TrajectoryGroup] = Field(min_length=1)


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
    reward_mean: float = Field(
        default=0.0,
        description="Mean reward of every group sent to the step, trained or not (a flat one, "
        "a stale one dropped): what the rollouts scored.",
    )
    duration_s: float = Field(
        default=0.0,
        description="The whole step's seconds, from its activity's start (waiting for the "
        "engine, loading, reading included) to its version saved (its upload after not in it).",
    )
    ack: ObjectRef = Field(description="Acknowledgement record: which trajectories were consumed.")


class HistoryBudget(InputContract):
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
    chain: str = Field(
        default="",
        max_length=128,
        description="The learner's first execution run id: segments a worker keeps are keyed "
        "by it, so a run id used again after `tempered runs rm` reads its own segments.",
    )


class FindConsumedResponse(Contract):
    consumed: list[str] = Field(description="Those of the asked ids an earlier segment took.")


class LearnerInput(Contract):
    """Input (and continue-as-new state) of `LearnerWorkflow`: constant in size. Task ids of
    earlier segments live in the ledger (`segment` segments written so far), steps in the acks;
    `pending` is bounded by the producer (the run's staleness gate and concurrency), and past a
    payload it is stored (`pending_parts`)."""

    run_id: Identifier
    config: GRPOConfig = GRPOConfig()
    max_steps: int = Field(default=10, ge=0)
    step: int = Field(default=0, ge=0)
    pending: list[TrajectoryGroup] = []
    pending_parts: list[ObjectRef] = Field(
        default=[],
        description="Stored `StepGroups` of groups pending before `pending`, where they passed "
        "a payload (workflows/learner_carry.py); a segment reads them back first thing. Left "
        "out of the payload when empty (`empty_left_out`).",
        exclude_if=empty_left_out,
    )
    consumed: list[str] = Field(
        default=[],
        description="Task ids trained on and not yet in the ledger: this segment's (at its "
        "start, the previous segment's, which it writes first; a run of the release before the "
        "ledger carried all of them here).",
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
    ledger_from: int | None = Field(
        default=None,
        ge=0,
        description="First step of `consumed` when a segment hands its ids to the next one to "
        "write (None: they start at `step`, or at 0 in an input of the release before the "
        "ledger).",
    )
    budget: HistoryBudget = HistoryBudget()
    burst: int = Field(
        default=64,
        ge=1,
        le=10_000,
        description="Most groups signalled at once (a training run's `concurrency`): room kept "
        "in the byte budget for those arriving while a continue-as-new is decided.",
    )


class LearnerDone(SignalPayload):
    """Signal `learner_done` from the learner to its training run: how it ended."""

    final: LearnerInput | None = Field(default=None, description="Its last state, if it ended.")
    error: str | None = Field(default=None, description="Why it failed, if it failed.")


class LearnerProgress(SignalPayload):
    """Signal from the learner to its training run after each step."""

    step: int
    policy_version: int
    trained_groups: int = Field(
        description="Groups sent to the step, trained or not (a flat one, a stale one dropped): "
        "named so for the runs of earlier builds, which require it. What was trained is "
        "`trained`, `skipped` and `dropped_stale`."
    )
    trained: int = Field(default=0, description="Trajectories whose tokens were in the update.")
    skipped: int = Field(default=0, description="Trajectories that gave no gradient.")
    reward_mean: float = Field(
        default=0.0, description="Mean reward of the groups sent to the step, trained or not."
    )
    loss: float = 0.0
    dropped_stale: int = Field(default=0, description="Trajectories dropped as too stale.")
    staleness: int = Field(default=0, description="Versions between the oldest group and the step.")
    state_bytes: int = Field(
        default=0,
        ge=0,
        description="The learner's state after the step as JSON, in bytes (0: not reported): "
        "what its `learner_done` and its result each carry, which the run's ending must fit.",
    )
