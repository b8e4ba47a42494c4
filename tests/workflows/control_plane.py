"""Scripted stand-ins for everything below the control plane, for tests of the training run and
the learner (tests/test_scale.py, tests/workflows/test_replay.py).

    suite = ScriptedSuite(train=50, heldout=2)      # load_tasks, prepare_run
    trainer = ScriptedTrainer()                      # train_step: remembers every group it got
    async with control_plane(client, store, suite, trainer):   # the workers of all three queues
        result, continued = await run_to_end(client, run, "train-x")

`StandInAgentTask` is registered under the name `AgentTaskWorkflow`: it sleeps 1–30 `UNIT`s
(10 ms by default) and returns a finished group, so a run of 20,000 tasks exercises the training
run and the learner, not the episode pipeline (tested on its own in
tests/workflows/test_agent_task.py). The sleeps are short because they are not always skipped:
once a child ends whose parent started it with `ParentClosePolicy.ABANDON` and then continued as
new (a run's learner), the time-skipping server keeps time locked for good (a leaked lock; ten
lines reproduce it: a parent that starts such a child, continues as new, lets it end, then sleeps
15 s takes 16 s of real time, 0.08 s without the continue-as-new), so a run's final evaluation
waited its tasks' 1–30 s in real time. Its input and result are plain dicts, read and written
in the shape of `AgentTaskInput` / `AgentTaskResult`, so it does not change with those models.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import AsyncIterator, Callable, Sequence
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHistory
from temporalio.worker import Worker

from activities.ledger import LedgerActivities
from contracts.common import ObjectRef
from contracts.learner import PolicyVersion, TrainStepRequest, TrainStepResponse
from contracts.names import Activity, Queue
from contracts.run import (
    LoadTasksRequest,
    LoadTasksResponse,
    PrepareRunRequest,
    TrainingRunInput,
    TrainingRunResult,
)
from contracts.task import TaskSpec
from infra.storage import ObjectStore
from workflows.learner import LearnerWorkflow
from workflows.training_run import TrainingRunWorkflow

DIGEST = "0" * 64


def task_spec(index: int, split: str = "train") -> TaskSpec:
    return TaskSpec(
        id=f"{split}-{index}",
        prompt=f"Write f() returning {index}.",
        entry_point="f",
        tests=f"def check(candidate):\n    assert candidate() == {index}\n",
        split=split,
    )


class ScriptedSuite:
    """`load_tasks` (a suite of `train` + `heldout` tasks) and `prepare_run` (version 0). With
    `flat_every` N, every Nth training task is `flat-<i>`: its stand-in group is flat."""

    def __init__(self, train: int, heldout: int = 0, flat_every: int = 0) -> None:
        self.train = [
            task_spec(i).model_copy(update={"id": f"flat-{i}"})
            if flat_every and i % flat_every == 0
            else task_spec(i)
            for i in range(train)
        ]
        self.heldout = [task_spec(i, "heldout") for i in range(heldout)]

    @activity.defn(name=Activity.LOAD_TASKS.value)
    async def load_tasks(self, request: LoadTasksRequest) -> LoadTasksResponse:
        return LoadTasksResponse(train=self.train, heldout=self.heldout)

    @activity.defn(name=Activity.PREPARE_RUN.value)
    async def prepare_run(self, request: PrepareRunRequest) -> PolicyVersion:
        return PolicyVersion(run_id=request.run_id, version=0, prefix="p/0")


class ScriptedTrainer:
    """`train_step`: publishes version step + 1 at once and remembers each step's groups. With
    `padding` N, each step's record (its acknowledgement's key) is N bytes larger."""

    def __init__(self, padding: int = 0) -> None:
        self.padding = padding
        self.steps: dict[int, list[str]] = {}
        """Step → task ids of its groups (a retried step overwrites its own entry)."""
        self.versions: dict[str, tuple[int, int]] = {}
        """Task id → (the step that trained its group, the group's policy version)."""

    @activity.defn(name=Activity.TRAIN_STEP.value)
    async def train_step(self, request: TrainStepRequest) -> TrainStepResponse:
        self.steps[request.step] = [g.task_id for g in request.groups]
        self.versions.update((g.task_id, (request.step, g.policy_version)) for g in request.groups)
        version = request.step + 1
        trajectories = sum(len(g.trajectories) for g in request.groups)
        return TrainStepResponse(
            policy=PolicyVersion(run_id=request.run_id, version=version, prefix=f"p/{version}"),
            loss=0.0,
            trained=trajectories,
            reward_mean=0.5,
            ack=ObjectRef(key=f"ack/{request.step}" + "x" * self.padding, size=1, sha256=DIGEST),
        )

    def trained(self) -> list[str]:
        """Every task id trained on, over all steps, in step order."""
        return [task for step in sorted(self.steps) for task in self.steps[step]]


@workflow.defn(name="AgentTaskWorkflow", sandboxed=False)
class StandInAgentTask:
    """A finished group after 1–30 `UNIT`s: half the samples solved (none, for a `flat-` task: a
    group with no GRPO signal, its rewards apart by round-off only, as 0.1 · 3 and 0.3)."""

    UNIT = timedelta(milliseconds=10)

    @workflow.run
    async def run(self, raw: dict[str, Any]) -> dict[str, Any]:
        task_id, run_id = raw["task"]["id"], raw.get("run_id", "adhoc")
        size = int(raw.get("group_size", 4))
        version = int(raw.get("policy_version") or 0)
        await workflow.sleep(self.UNIT * self.units(task_id))
        flat = task_id.startswith("flat-")
        rewards = [1.0 if s % 2 == 0 else 0.0 for s in range(size)]
        if flat:
            rewards = [0.1 * 3 if s % 2 == 0 else 0.3 for s in range(size)]
        return {
            "run_id": run_id,
            "task_id": task_id,
            "state": "DONE",
            "turns": 1,
            "rewards": rewards,
            "solved": [r >= 1.0 for r in rewards],
            "best_reward": max(rewards),
            "policy_versions": [version] * size,
            "trajectories": [
                {
                    "key": f"runs/{run_id}/trajectories/{task_id}--s{s}.json",
                    "size": 1,
                    "sha256": DIGEST,
                }
                for s in range(size)
            ],
        }

    def units(self, task_id: str) -> int:
        """How many `UNIT`s task `task_id` takes: 1–30, fixed per task."""
        return 1 + zlib.crc32(task_id.encode()) % 30


@workflow.defn(name="AgentTaskWorkflow", sandboxed=False)
class SecondsAgentTask(StandInAgentTask):
    """The stand-in at its former pace, 1–30 (skipped) seconds a task, where tasks finish
    seconds apart and the learner is idle between steps: kept for the 20,000-task run, whose
    recorded figures were measured at it."""

    UNIT = timedelta(seconds=1)

    @workflow.run
    async def run(self, raw: dict[str, Any]) -> dict[str, Any]:
        return await super().run(raw)


@contextlib.asynccontextmanager
async def control_plane(
    client: Client,
    store: ObjectStore,
    suite: ScriptedSuite,
    trainer: ScriptedTrainer,
    *,
    agent_task: type = StandInAgentTask,
    learner: type = LearnerWorkflow,
    rewards: Sequence[Callable[..., Any]] = (),
) -> AsyncIterator[None]:
    """The run, the learner and the stand-in tasks (agent-tasks), the scripted suite and trainer
    (learner), the suite loader, the real ledger and `rewards` (rewards), for the `with` block."""
    ledger = LedgerActivities(store)
    workflows = [TrainingRunWorkflow, learner, agent_task]
    async with (
        Worker(
            client,
            task_queue=Queue.AGENT_TASKS.value,
            workflows=workflows,
            max_concurrent_workflow_tasks=64,
        ),
        Worker(
            client,
            task_queue=Queue.LEARNER.value,
            activities=[trainer.train_step, suite.prepare_run],
        ),
        Worker(
            client,
            task_queue=Queue.REWARDS.value,
            activities=[suite.load_tasks, ledger.record_ledger, ledger.find_consumed, *rewards],
        ),
    ):
        yield


async def run_to_end(
    client: Client, run: TrainingRunInput, workflow_id: str
) -> tuple[TrainingRunResult, bool]:
    """Start `run` as `workflow_id` and wait for its result; with whether its first segment
    continued as new."""
    handle = await client.start_workflow(
        TrainingRunWorkflow.run, run, id=workflow_id, task_queue=Queue.AGENT_TASKS.value
    )
    result = await handle.result()
    first = client.get_workflow_handle(workflow_id, run_id=handle.result_run_id)
    status = (await first.describe()).status
    return result, status == WorkflowExecutionStatus.CONTINUED_AS_NEW


async def run_histories(client: Client, workflow_id: str) -> list[WorkflowHistory]:
    """The history of every run of `workflow_id`, first to last (its continues-as-new)."""
    last = await client.get_workflow_handle(workflow_id).fetch_history()
    started = last.events[0].workflow_execution_started_event_attributes
    histories, run_id = [], started.first_execution_run_id
    while run_id:
        history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
        histories.append(history)
        end = history.events[-1]
        continued = end.HasField("workflow_execution_continued_as_new_event_attributes")
        attributes = end.workflow_execution_continued_as_new_event_attributes
        run_id = attributes.new_execution_run_id if continued else ""
    return histories
