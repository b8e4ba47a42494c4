"""Contracts of a training run (`TrainingRunWorkflow`, what `tempered train` starts): its input,
the suite it loads, its held-out evaluations, its progress and result, and the constant-size
state it carries through continue-as-new. The learner's own are in contracts/learner.py."""

import hashlib
import json
import random
import re
from collections.abc import Sequence
from datetime import datetime

from pydantic import Field

from contracts.common import (
    MAX_ID,
    Contract,
    Identifier,
    InputContract,
    is_identifier,
)
from contracts.errors import ErrorType, fail
from contracts.evaluation import EvalResult
from contracts.learner import (
    GRPOConfig,
    HistoryBudget,
    LearnerDone,
    LearnerProgress,
    TrainStepResponse,
)
from contracts.names import is_evaluation
from contracts.new_run import MAX_STEPS, new_run_problem
from contracts.task import (
    AgentTaskInput,
    RewardConfig,
    SamplingParams,
    SandboxLimits,
    TaskSpec,
    eval_task_input,
)


class PrepareRunRequest(Contract):
    """Publish policy version 0 of a run from a preset, a local HF dir or an S3 prefix."""

    run_id: Identifier
    base_model: str
    run: "TrainingRunInput | None" = Field(
        default=None, description="The run's input, stored once as runs/<run>/run.json."
    )
    heldout: "HeldoutSet | None" = Field(
        default=None, description="The run's held-out tasks, recorded in run.json after `run`."
    )


class PrunePoliciesRequest(Contract):
    """Delete policy versions 1 .. `below` - 1 of a run that is training (`keep_versions`)."""

    run_id: Identifier
    below: int = Field(ge=1, description="The oldest version kept besides version 0.")
    since: int | None = Field(
        default=None,
        ge=1,
        description="Versions below it were deleted by earlier calls: only those from it are "
        "looked at (None: every version listed).",
    )


class PrunePoliciesResponse(Contract):
    deleted: list[int] = Field(description="Versions deleted by this call (none if done before).")


class RunProgress(Contract):
    """Answer of `TrainingRunWorkflow`'s `progress` query."""

    tasks_started: int = Field(default=0, ge=0)
    tasks_done: int = Field(default=0, ge=0)
    in_flight: int = Field(default=0, ge=0)
    redrawn: int = Field(default=0, ge=0, description="Flat groups not sent to the learner.")
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


def task_digest(task: TaskSpec) -> str:
    """16 hex digits of `task`'s spec: another for a task rewritten under the same id. Fields at
    their default are left out, so that a field a later build adds does not change it."""
    data = task.model_dump(mode="json", exclude_defaults=True)
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class HeldoutSet(Contract):
    """The held-out tasks a run evaluates (`spread` of its suite's, quarantined ones left out),
    as its run.json records them: `tempered eval --run` measures these, and refuses a task gone
    or changed since, where rebuilding the set from today's suite and quarantine list could
    give other tasks."""

    tasks: dict[str, str] = Field(description="Task id: `task_digest`, in the run's order.")

    @classmethod
    def of(cls, tasks: Sequence[TaskSpec]) -> "HeldoutSet":
        return cls(tasks={task.id: task_digest(task) for task in tasks})


def draw_order(train: Sequence[TaskSpec], seed: int) -> list[TaskSpec]:
    """The order in which a run draws its training tasks: the same for the same seed, every run."""
    order = list(train)
    random.Random(seed).shuffle(order)
    return order


def drawn_task(order: Sequence[TaskSpec], index: int) -> TaskSpec:
    """The `index`-th task a run starts: the order repeats in epochs, `<id>-e<epoch>`. A drawn id
    over an id's `MAX_ID` characters fails the run (INVALID_TASK, not retried), naming the task: its
    task workflow could not decode its input and would be retried for ever. Checked here, not on
    `TaskSpec`: suites stored by earlier runs must still decode. No patch: a run of an earlier
    build that drew such an id waits for ever on a task that cannot run (already stuck)."""
    epoch, position = divmod(index, len(order))
    task = order[position]
    drawn = f"{task.id}-e{epoch}"
    if not is_identifier(drawn):
        raise fail(
            ErrorType.INVALID_TASK,
            f"task {task.id!r} ({len(task.id)} characters), drawn in epoch {epoch} as "
            f"`<id>-e{epoch}`, makes an id of {len(drawn)} characters, over the {MAX_ID} an id "
            f"may have; give it an id of at most {MAX_ID - len(drawn) + len(task.id)} characters",
        )
    return task.model_copy(update={"id": drawn})


def suite_task_id(run_id: str, task_id: str) -> str:
    """The suite id of the task that run `run_id` rolled out as `task_id` (`Trajectory.task_id`):
    a training run's tasks are drawn (`drawn_task`: `<id>-e<epoch>` → `<id>`), an evaluation's
    keep their suite ids (`is_evaluation`), whatever they end with."""
    drawn = None if is_evaluation(run_id) else re.fullmatch(r"(.+)-e[0-9]+", task_id)
    return drawn[1] if drawn else task_id


def redraws_allowed(budget: int, steps: int, steps_done: int) -> int:
    """Flat groups a run may have redrawn (dynamic sampling) while its learner has taken
    `steps_done` of its `steps` steps: the run's `budget` spread evenly, ⌈budget·(done+1)/steps⌉,
    so each step's groups can replace flat ones, not only the first step's."""
    return min(budget, -(-budget * (steps_done + 1) // steps))


class TrainingRunInput(InputContract):
    """Input of `TrainingRunWorkflow` (what `tempered train` starts). Fields without an upper
    bound got none because inputs recorded before must still decode (a new bound on an old
    field would fail an in-flight run's replay); a new run's limits are `new_run_problem`'s."""

    run_id: Identifier
    """The run's id: its workflow is `train-<run_id>`, its objects live under `runs/<run_id>/`;
    a new run's must be new (`tempered train --run-id`, default `run-<timestamp>`) and not of an
    evaluation's form (`new_run_problem`)."""
    suite: str = "starter"
    """Task suite: a built-in one (`starter`, `basics`, `workspace`), `FILE.jsonl` or
    `harbor:DIR`; its training tasks are drawn, its held-out ones evaluated."""
    base_model: str = "tiny"
    """Model published as policy version 0: a preset (`tiny`, `smollm2`), a Hugging Face
    directory or an `s3://` prefix."""
    steps: int = Field(default=3, ge=1, le=MAX_STEPS)
    """Learner steps (policy versions published) before the run ends."""
    group_size: int = Field(default=4, ge=1, le=256)
    """G: episodes sampled per task, whose rewards are compared with each other (GRPO); a new
    run needs 2 or more (`new_run_problem`)."""
    max_turns: int = Field(default=2, ge=1, le=256, description="Steps per episode at most.")
    eval_max_turns: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="Turns of a held-out episode at most (None: `max_turns`); 1 measures pass@1 "
        "alone and skips the second turns a greedy policy may not use.",
    )
    max_context_tokens: int = Field(
        default=4096, ge=64, le=1 << 20, description="Context budget of an episode (tokens)."
    )
    concurrency: int = Field(
        default=8,
        ge=1,
        le=2000,  # not lowered to the limit: stored inputs of earlier releases must decode
        description="Agent tasks in flight at most. Temporal allows a workflow 2,000 pending "
        "children: the run keeps these, its held-out tasks and its learner together within "
        "`MAX_PENDING_CHILDREN` (workflows/children.py), fewer tasks waiting past it.",
    )
    eval_every: int = Field(
        default=0,
        ge=0,
        description="Held-out eval every N steps; 0 = ends only. A new run's is at most "
        "`MAX_STEPS` (`contracts.new_run`).",
    )
    heldout_limit: int = Field(
        default=0,
        ge=0,
        description="Held-out tasks each eval runs: 0 = all of the suite's; N = N of them spread "
        "evenly over the suite's held-out list (`spread`), the same N at every eval. A new run's "
        "is at most `MAX_HELDOUT_LIMIT` (`contracts.new_run`).",
    )
    time_budget_s: float = Field(
        default=0,
        ge=0,  # `nan` and `inf` are refused by name (`InputContract`)
        description="Stop after this long; 0 = none. A new run's is at most "
        "`MAX_TIME_BUDGET_S` (`contracts.new_run`).",
    )
    keep_versions: int = Field(
        default=0,
        ge=0,
        le=100000,
        description="Policy versions kept in the store while the run trains: 0 keeps every one; "
        "N keeps version 0, the newest N and every version a rollout in flight or an evaluation "
        "still reads, and deletes the others (`workflows/retention.py`).",
    )
    sampling: SamplingParams = SamplingParams()
    """How training rollouts sample (temperature, top-p, completion length, stop rules)."""
    eval_sampling: SamplingParams = SamplingParams(temperature=0.0, priority=1)
    """How held-out evaluations sample: greedy by default, behind the training rows (`priority`
    1) at the decoder."""
    reward: RewardConfig = RewardConfig()
    """An episode's reward: for solving, and per failed round."""
    limits: SandboxLimits = SandboxLimits()
    """Resource limits of every sandboxed execution of the run."""
    grpo: GRPOConfig = GRPOConfig()
    """How the learner turns finished groups into an update."""
    heartbeat_timeout_s: float = Field(default=30.0, ge=1.0, le=3600)
    """An activity of the run's tasks silent this long is retried (its worker is taken for
    dead)."""
    seed: int = Field(
        default=0,
        # No bounds here: runs recorded with a negative seed must still decode. A new run
        # refuses one (`new_run_problem`), as the CLI does.
        description="Seeds the order in which training tasks are drawn (a new run's is 0 to "
        "`MAX_SEED`).",
    )
    budget: HistoryBudget = HistoryBudget()
    """How much of Temporal's history limits the run's and its learner's workflows use before
    they continue as new."""
    resume: "RunResume | None" = Field(
        default=None, description="Set by the run itself when it continues as new."
    )

    def new_run_problem(self) -> str | None:
        """Why a new run may not start with this input (None: it may), asked where a run is built
        (`infra.presets.load_preset`), not when a stored input is read: runs of earlier
        releases must still decode (their histories replay). The rules: `contracts.new_run`."""
        return new_run_problem(self)

    def task_input(self, task: TaskSpec, policy_version: int) -> AgentTaskInput:
        """The training rollout of `task` (a group of `group_size`), pinned to `policy_version`."""
        return AgentTaskInput(
            task=task,
            run_id=self.run_id,
            group_size=self.group_size,
            max_turns=self.max_turns,
            max_context_tokens=self.max_context_tokens,
            sampling=self.sampling,
            reward=self.reward,
            limits=self.limits,
            policy_version=policy_version,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
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
            max_turns=self.eval_turns,
            max_context_tokens=self.max_context_tokens,
            heartbeat_timeout_s=self.heartbeat_timeout_s,
        )

    @property
    def eval_turns(self) -> int:
        """Turns of a held-out episode at most."""
        return self.eval_max_turns or self.max_turns


class RunRecord(TrainingRunInput):
    """What runs/<run>/run.json holds: the run's input and, for runs started since it was
    recorded, its held-out set (None in the files of earlier builds, which decode as they are)."""

    heldout: HeldoutSet | None = None

    @staticmethod
    def of(run: TrainingRunInput, heldout: HeldoutSet | None) -> TrainingRunInput:
        """The record of `run`: without a held-out set, the input alone, the bytes an earlier
        build wrote (its attempt retried here must find them the same: the write is create-only)."""
        if heldout is None:
            return run
        return RunRecord.model_validate(run.model_dump() | {"heldout": heldout})


class RunResume(Contract):
    """Where a `TrainingRunWorkflow` continues after continue-as-new: constant in size (the
    suite, counters, bounded tails). No agent task is in flight at that moment (the run drains
    them first); the learner lives on (a child that outlives its parent's runs)."""

    tasks: LoadTasksResponse
    started: int = Field(ge=0, description="Training tasks started so far (the next index).")
    done: int = Field(ge=0)
    redrawn: int = Field(default=0, ge=0, description="Flat groups not sent to the learner.")
    pruned_below: int = Field(default=1, ge=1, description="Versions below it (but 0) deleted.")
    progress: list[LearnerProgress] = Field(description="The last `PROGRESS_TAIL` steps.")
    evals: list[EvalResult] = Field(description="The first and the last `EVAL_TAIL` evals.")
    deadline: datetime | None = Field(description="When the time budget ends (None: never).")
    segment: int = Field(ge=1, description="Runs of this workflow before this one.")
    stopped: str | None = Field(
        default=None, description="Why the run was told to stop starting tasks (`stop`)."
    )
    learner_done: LearnerDone | None = Field(
        default=None, description="The learner's `learner_done`, if it ended while the run drained."
    )


class TrainingRunResult(Contract):
    run_id: str
    steps: int
    tasks_started: int
    tasks_done: int
    redrawn: int = Field(default=0, ge=0, description="Flat groups not sent to the learner.")
    history: list[TrainStepResponse] = Field(
        description="The last `HISTORY_TAIL` steps (every step: the acks in the store)."
    )
    evals: list[EvalResult]
    stopped: str | None = Field(
        default=None,
        description="Why the run ended before its steps: the `stop` signal's reason, or "
        '"time budget spent".',
    )


PrepareRunRequest.model_rebuild()
RunRecord.model_rebuild()
RunProgress.model_rebuild()
TrainingRunInput.model_rebuild()
