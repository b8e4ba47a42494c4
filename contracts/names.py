"""The names every part of Tempered shares: task queues, workflows, activities, signals, search
attributes.

Workflows call activities by these names, so a workflow module never imports an activity module.
"""

import re
from enum import StrEnum


class Queue(StrEnum):
    """Temporal task queues; each has its own worker process (`tempered worker QUEUE`)."""

    AGENT_TASKS = "agent-tasks"
    INFERENCE = "inference"
    SANDBOX = "sandbox"
    REWARDS = "rewards"
    LEARNER = "learner"


class Workflow(StrEnum):
    AGENT_TASK = "AgentTaskWorkflow"
    LEARNER = "LearnerWorkflow"
    TRAINING_RUN = "TrainingRunWorkflow"


class Activity(StrEnum):
    """Activity type names, registered by the worker of the queue named in ACTIVITY_QUEUE."""

    GENERATE = "generate"
    EXECUTE = "execute"
    WRITE_TRAJECTORIES = "write_trajectories"
    LOAD_TASKS = "load_tasks"
    PREPARE_RUN = "prepare_run"
    TRAIN_STEP = "train_step"
    STORE_STEP_GROUPS = "store_step_groups"
    LOAD_STEP_GROUPS = "load_step_groups"
    RECORD_LEDGER = "record_ledger"
    FIND_CONSUMED = "find_consumed"
    OPEN_SESSIONS = "open_sessions"
    ENV_STEP = "env_step"
    VERIFY_EPISODES = "verify_episodes"
    CLOSE_SESSIONS = "close_sessions"
    PRUNE_POLICIES = "prune_policies"


class Signal(StrEnum):
    """Workflow signals, by the workflow that handles them."""

    ABORT = "abort"
    """AgentTaskWorkflow: stop after the current step (circuit breaker, operator)."""
    ADD_GROUPS = "add_groups"
    """LearnerWorkflow: finished groups to train on (from the run)."""
    FINISH = "finish"
    """LearnerWorkflow: train on what is queued, then end (from the run)."""
    PING = "ping"
    """LearnerWorkflow: nothing to do; the run's probe that it is still there (a run waiting
    with nothing in flight sends it now and then: one that cannot be delivered fails the run)."""
    LEARNER_PROGRESS = "learner_progress"
    """TrainingRunWorkflow: a learner step done (from the learner)."""
    LEARNER_DONE = "learner_done"
    """TrainingRunWorkflow: the learner ended, with its final state or error."""
    STOP = "stop"
    """TrainingRunWorkflow: start no more tasks; finish those in flight, the learner's last
    step and the final evaluation (`tempered stop`)."""


ACTIVITY_QUEUE: dict[Activity, Queue] = {
    Activity.GENERATE: Queue.INFERENCE,
    Activity.EXECUTE: Queue.SANDBOX,
    Activity.WRITE_TRAJECTORIES: Queue.REWARDS,
    Activity.LOAD_TASKS: Queue.REWARDS,
    Activity.PREPARE_RUN: Queue.LEARNER,
    Activity.TRAIN_STEP: Queue.LEARNER,
    Activity.STORE_STEP_GROUPS: Queue.LEARNER,
    Activity.LOAD_STEP_GROUPS: Queue.LEARNER,
    Activity.RECORD_LEDGER: Queue.REWARDS,
    Activity.FIND_CONSUMED: Queue.REWARDS,
    Activity.OPEN_SESSIONS: Queue.SANDBOX,
    Activity.ENV_STEP: Queue.SANDBOX,
    Activity.VERIFY_EPISODES: Queue.SANDBOX,
    Activity.CLOSE_SESSIONS: Queue.SANDBOX,
    Activity.PRUNE_POLICIES: Queue.REWARDS,
}
"""The queue each activity is registered on. `env_step` and `close_sessions` are *called* on the
queue of the sandbox worker that holds the session (`SessionRef.queue`), which that worker
polls besides `sandbox`."""


class SearchAttr(StrEnum):
    """Custom search attributes registered by `tempered up` (name → Temporal type below)."""

    STATE = "TemperedState"
    TURN = "TemperedTurn"
    REWARD = "TemperedReward"
    POLICY_VERSION = "TemperedPolicyVersion"
    TASK_ID = "TemperedTaskId"
    RUN_ID = "TemperedRunId"
    TOOL_CALLS = "TemperedToolCalls"


SEARCH_ATTRIBUTE_TYPES: dict[SearchAttr, str] = {
    SearchAttr.STATE: "Keyword",
    SearchAttr.TURN: "Int",
    SearchAttr.REWARD: "Double",
    SearchAttr.POLICY_VERSION: "Int",
    SearchAttr.TASK_ID: "Keyword",
    SearchAttr.RUN_ID: "Keyword",
    SearchAttr.TOOL_CALLS: "Int",
}


def run_workflow_id(run: str) -> str:
    """Id of the TrainingRunWorkflow of run `run` (one run, one workflow)."""
    return f"train-{run}"


def learner_workflow_id(run_workflow: str) -> str:
    """Id of the LearnerWorkflow the training run `run_workflow` (its workflow id) starts."""
    return f"{run_workflow}-learner"


def task_workflow_id(run: str, task: str) -> str:
    """Id of run `run`'s AgentTaskWorkflow rolling out training task `task` (`<run>-task-<task>`:
    a task id may itself hold `-task-`, so the id alone does not always tell whose it is)."""
    return f"{run}-task-{task}"


def eval_run_id(run: str, version: int, suite: str | None = None, tag: str | None = None) -> str:
    """The run id of an evaluation of `run`'s policy `version`: `<run>-eval-v<version>` by the
    training run, `<run>-eval-v<version>--<suite>-<tag>` by `tempered eval` (`tag`: a digest of
    its settings and a nonce of its own, so no two evaluations share the turns stored under the
    id). Its tasks' workflow ids are `<eval run>-<task>`; a task id begins with a letter or a
    digit, so the second `-` tells `tempered eval`'s apart from the training run's own
    (`run_evaluates`). `tempered eval`s of earlier releases have one `-` there."""
    tail = "" if suite is None else "-" + re.sub(r"[^A-Za-z0-9_-]", "_", suite)
    tail += "" if tag is None else "-" + re.sub(r"[^A-Za-z0-9_-]", "_", tag)
    return f"{run}-eval-v{version}" + (f"-{tail}" if tail else "")


EVAL_MARK = r"-eval-v\d+(-|$)"
"""What an evaluation's run id has after its run's (`eval_run_id`); no training run's id has it
(`TrainingRunInput`), so `tempered runs rm <run>` never takes another run for an evaluation."""
RUN_EVAL_MARK = r"-eval-v\d+(-(?!-)|$)"
"""What the training run's own evaluations' ids (and their tasks') have after its run's: not
the second `-` of `tempered eval`'s (`eval_run_id`)."""


def evaluates(name: str, run: str) -> bool:
    """Whether a run id or workflow id belongs to an evaluation of `run` (`eval_run_id`), the
    training run's own or a `tempered eval`'s."""
    return re.match(re.escape(run) + EVAL_MARK, name) is not None


def run_evaluates(name: str, run: str) -> bool:
    """Whether a run id or workflow id belongs to one of the training run `run`'s own held-out
    evaluations, not to a `tempered eval` of its policy (those of earlier releases, whose id had
    no second `-`, read as the run's own)."""
    return re.match(re.escape(run) + RUN_EVAL_MARK, name) is not None


def is_evaluation(run_id: str) -> bool:
    """Whether `run_id` is an evaluation's (of whichever run)."""
    return re.search(EVAL_MARK, run_id) is not None
