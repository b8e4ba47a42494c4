"""A training run that ends early, cancelled (`tempered stop --cancel`) or failed (a task's or a
held-out task's child failed), while tasks are in flight: its AgentTaskWorkflow children, the
rollouts' and the held-out evaluation's, are cancelled, not terminated, so each runs its
`finally` (where AgentTaskWorkflow closes its workspace sessions): `CANCELLED_WITH_RUN_PATCH`.
Before, the children's default parent close policy (TERMINATE) ended them where they stood, and
each workspace session of each task in flight held its uid slot and tmpfs until the sandbox
worker's TTL. A failure wakes the run also where it waits for its last tasks in flight
(`FAILS_AT_ONCE_PATCH`; before, it waited for them: here, for good). On the dev server, with a
stand-in task that waits until it is cancelled (or told to fail) and cleans up through an
activity, as AgentTaskWorkflow closes its sessions."""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError, CancelledError

from contracts.errors import ErrorType, fail
from contracts.learner import GRPOConfig
from contracts.names import Queue
from contracts.run import TrainingRunInput
from infra.storage import ObjectStore
from tests.fixtures.temporal import TemporalServer
from tests.workflows.control_plane import ScriptedSuite, ScriptedTrainer, control_plane
from tests.workflows.harness import connect
from tests.workflows.replaying import replay
from workflows.agent_task import CANCELLED_WITH_RUN_PATCH
from workflows.training_run import TrainingRunWorkflow

HISTORIES = Path(__file__).parent / "histories"
CANCELLED, FAILS, HELD_OUT_FAILS = "cancelled", "fails", "held-out-fails"
RECORDED_AS = {  # test_replay.py replays them
    CANCELLED: "training_run_children_cancelled.json",
    FAILS: "training_run_task_failed.json",
    HELD_OUT_FAILS: "training_run_held_out_failed.json",
}
RUN = TrainingRunInput(
    run_id="early",
    steps=2,
    group_size=2,
    concurrency=3,
    grpo=GRPOConfig(groups_per_step=2, max_staleness=1),
)
LAST = RUN.model_copy(
    update={"steps": 1, "grpo": RUN.grpo.model_copy(update={"redraw_flat_groups": 1})}
)
"""A run whose 2 tasks are in flight, and which may redraw one: it waits for them to end."""
HELD_OUT = 2
"""Held-out tasks: a run has them in flight, evaluating v0, beside its rollouts."""
CLEANED: list[str] = []
"""Workflow ids of the stand-in tasks whose `finally` ran."""


@activity.defn(name="close_probe")
async def close_probe(workflow_id: str) -> None:
    CLEANED.append(workflow_id)


@workflow.defn(name="AgentTaskWorkflow", sandboxed=False)
class LingeringTask:
    """Waits until cancelled, or told `fail` (then fails for good); either way it ends through
    its `finally`, an activity, as AgentTaskWorkflow's `finally: await sessions.close()`."""

    def __init__(self) -> None:
        self._fail = False

    @workflow.signal(name="fail")
    def fail_now(self) -> None:
        self._fail = True

    @workflow.run
    async def run(self, raw: dict[str, Any]) -> dict[str, Any]:
        try:
            await workflow.wait_condition(lambda: self._fail)
            raise fail(ErrorType.INVALID_TASK, "told to fail")
        finally:
            await workflow.execute_activity(
                close_probe,
                workflow.info().workflow_id,
                task_queue=Queue.REWARDS.value,
                start_to_close_timeout=timedelta(seconds=10),
            )


async def started_children(handle: WorkflowHandle[Any, Any], count: int) -> list[str]:
    """The workflow ids of the first `count` AgentTaskWorkflow children the run started."""
    tasks: list[str] = []
    for _ in range(300):
        started = [
            e.child_workflow_execution_started_event_attributes
            for e in (await handle.fetch_history()).events
            if e.HasField("child_workflow_execution_started_event_attributes")
        ]
        tasks = [
            a.workflow_execution.workflow_id
            for a in started
            if a.workflow_type.name == "AgentTaskWorkflow"
        ]
        if len(tasks) >= count:
            return tasks
        await asyncio.sleep(0.1)
    raise AssertionError(f"the run started fewer than {count} tasks: {tasks}")


async def failure(handle: WorkflowHandle[Any, Any], timeout_s: float = 30) -> BaseException | None:
    """Why the run failed, once it has (an AssertionError if it has not within `timeout_s`,
    unchained: pytest fails to format a timed-out `wait_for`'s chain here)."""
    try:
        await asyncio.wait_for(handle.result(), timeout_s)
    except WorkflowFailureError as err:
        return err.cause
    except TimeoutError:
        pass
    else:
        raise AssertionError("the run completed")
    raise AssertionError(f"the run had not ended {timeout_s} s on")


async def closed(client: Client, workflow_id: str) -> WorkflowExecutionStatus | None:
    """The child's status once it is no longer running (RUNNING after 30 s)."""
    status = None
    for _ in range(300):
        status = (await client.get_workflow_handle(workflow_id).describe()).status
        if status != WorkflowExecutionStatus.RUNNING:
            break
        await asyncio.sleep(0.1)
    return status


@pytest.mark.asyncio
@pytest.mark.parametrize("end", [CANCELLED, FAILS, HELD_OUT_FAILS])
async def test_a_run_that_ends_early_cancels_its_tasks_in_flight(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore, end: str
) -> None:
    """Cancelled, or a rollout fails, while the run waits for a free slot; or a held-out task
    fails while it waits for its last tasks in flight (`_task_due`)."""
    shape = LAST if end == HELD_OUT_FAILS else RUN
    run = shape.model_copy(update={"run_id": f"early-{end}"})
    client = await connect(temporal_server.address, namespace)
    suite = ScriptedSuite(train=10, heldout=HELD_OUT)
    plane = control_plane(
        client, store, suite, ScriptedTrainer(), agent_task=LingeringTask, rewards=[close_probe]
    )
    async with plane:
        handle = await client.start_workflow(
            TrainingRunWorkflow.run, run, id=f"train-{run.run_id}", task_queue=Queue.AGENT_TASKS
        )
        children = await started_children(
            handle, min(shape.concurrency, shape.steps * shape.grpo.groups_per_step) + HELD_OUT
        )
        kind = "-eval-" if end == HELD_OUT_FAILS else "-task-"  # a held-out task, or a rollout
        failing = next(c for c in children if kind in c)
        if end == CANCELLED:
            await handle.cancel()
        else:
            await client.get_workflow_handle(failing).signal("fail")
        cause = await failure(handle)
        statuses = {child: await closed(client, child) for child in children}
        history = await handle.fetch_history()

    expected = dict.fromkeys(children, WorkflowExecutionStatus.CANCELED)
    if end == CANCELLED:
        assert isinstance(cause, CancelledError), cause
    else:
        assert isinstance(cause, ApplicationError) and cause.type == ErrorType.TASK_FAILED, cause
        assert cause.message.startswith("held-out task" if end == HELD_OUT_FAILS else "task")
        expected[failing] = WorkflowExecutionStatus.FAILED
    assert statuses == expected  # before: TERMINATED, the siblings' `finally` never ran
    assert sorted(c for c in CLEANED if c in children) == sorted(children)
    markers = [e for e in history.events if e.HasField("marker_recorded_event_attributes")]
    assert any(CANCELLED_WITH_RUN_PATCH.encode() in e.SerializeToString() for e in markers)
    await replay(history, TrainingRunWorkflow)
    if os.environ.get("TEMPERED_RECORD_HISTORIES"):
        (HISTORIES / RECORDED_AS[end]).write_text(history.to_json())
