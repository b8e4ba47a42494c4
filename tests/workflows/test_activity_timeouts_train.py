"""A `train_step`'s start-to-close grows with the step, and a step that reaches it is not started
over for ever (workflows/activity_options.py), on the dev server.

It was a fixed 60 minutes, retried without limit: a step longer than that (more groups, larger
G, more epochs, a slower learner) timed out at every attempt and trained from scratch again,
for ever, while the run looked alive. Its heartbeats come from the worker's event loop, not the
training thread, so a step that no longer advances still heartbeats: only the start-to-close
finds it, and another attempt of a step that overran would overrun again.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, TimeoutError, TimeoutType
from temporalio.worker import Worker

from activities.ledger import LedgerActivities
from contracts.common import ObjectRef
from contracts.learner import (
    GRPOConfig,
    LearnerInput,
    TrainStepRequest,
    TrainStepResponse,
    TrajectoryGroup,
)
from contracts.names import Activity, Queue, Signal
from infra.storage import ObjectStore
from tests.workflows.control_plane import ScriptedTrainer
from tests.workflows.harness import connect
from workflows.activity_options import activity_options
from workflows.learner import LearnerWorkflow

REF = ObjectRef(key="k", size=1, sha256="0" * 64)
TIMEOUT_S = 2.0
"""The probe's start-to-close: short, for the test."""


def group(task: str, size: int) -> TrajectoryGroup:
    return TrajectoryGroup(
        task_id=task, trajectories=[REF] * size, rewards=[1.0] * size, policy_version=0
    )


@pytest.mark.asyncio
async def test_a_larger_step_is_allowed_longer(
    temporal_server, namespace, store: ObjectStore
) -> None:
    """Two steps of one group each, G = 1 then G = 64: the second's start-to-close is longer."""
    client = await connect(temporal_server.address, namespace)
    trainer, ledger = ScriptedTrainer(), LedgerActivities(store)
    async with (
        Worker(client, task_queue=Queue.AGENT_TASKS.value, workflows=[LearnerWorkflow]),
        Worker(client, task_queue=Queue.LEARNER.value, activities=[trainer.train_step]),
        Worker(
            client,
            task_queue=Queue.REWARDS.value,
            activities=[ledger.record_ledger, ledger.find_consumed],
        ),
    ):
        handle = await client.start_workflow(
            LearnerWorkflow.run,
            LearnerInput(run_id="r", config=GRPOConfig(groups_per_step=1), max_steps=2),
            id=f"learner-timeouts-{uuid.uuid4().hex[:6]}",
            task_queue=Queue.AGENT_TASKS.value,
            start_signal=Signal.ADD_GROUPS.value,
            start_signal_args=[[group("small", 1)]],
        )
        while not trainer.steps:
            await asyncio.sleep(0.05)
        await handle.signal(LearnerWorkflow.add_groups, [group("large", 64)])
        await handle.result()
        history = await handle.fetch_history()

    timeouts = [
        e.activity_task_scheduled_event_attributes.start_to_close_timeout.ToTimedelta()
        for e in history.events
        if e.activity_task_scheduled_event_attributes.activity_type.name == Activity.TRAIN_STEP
    ]
    assert trainer.trained() == ["small", "large"]
    small, large = timeouts
    assert large > small, timeouts


class Hung:
    """`train_step` that never ends (heartbeating, as the real step does while its thread
    trains); counts its attempts."""

    def __init__(self) -> None:
        self.attempts = 0

    @activity.defn(name=Activity.TRAIN_STEP.value)
    async def train_step(self, request: TrainStepRequest) -> TrainStepResponse:
        self.attempts += 1
        for _ in range(200):  # 20 s at most: the timeout's cancel ends it sooner
            activity.heartbeat()
            await asyncio.sleep(0.1)
        raise AssertionError("still running 20 s after its start-to-close")


@workflow.defn(name="TrainTimeoutProbe", sandboxed=False)
class TrainTimeoutProbe:
    """Runs one `train_step` with the learner's options, its start-to-close cut to
    `TIMEOUT_S` (the real one is an hour and more)."""

    @workflow.run
    async def run(self, request: TrainStepRequest) -> TrainStepResponse:
        options = activity_options(Activity.TRAIN_STEP, 30.0)
        policy: RetryPolicy = options["retry_policy"]
        options["retry_policy"] = RetryPolicy(  # retried at once, for the test
            initial_interval=timedelta(milliseconds=100),
            maximum_attempts=policy.maximum_attempts,
            non_retryable_error_types=policy.non_retryable_error_types,
        )
        options["start_to_close_timeout"] = timedelta(seconds=TIMEOUT_S)
        options["task_queue"] = workflow.info().task_queue  # the test's own worker
        return await workflow.execute_activity(
            Activity.TRAIN_STEP.value, request, result_type=TrainStepResponse, **options
        )


@pytest.mark.asyncio
async def test_a_step_that_reaches_its_start_to_close_fails_instead_of_starting_over(
    temporal_server, namespace
) -> None:
    """One attempt, then the workflow gets the start-to-close timeout (the learner fails and
    the run says why); before, the step was started over every time it timed out."""
    client = await connect(temporal_server.address, namespace)
    hung = Hung()
    queue = f"train-timeout-{uuid.uuid4().hex[:6]}"
    async with Worker(
        client, task_queue=queue, workflows=[TrainTimeoutProbe], activities=[hung.train_step]
    ):
        handle = await client.start_workflow(
            TrainTimeoutProbe.run,
            TrainStepRequest(run_id="r", step=0, groups=[group("a", 4)], config=GRPOConfig()),
            id=queue,
            task_queue=queue,
            execution_timeout=timedelta(seconds=8 * TIMEOUT_S),
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
        history = await handle.fetch_history()

    error = failed.value.cause
    assert isinstance(error, ActivityError), error  # not the probe's own timeout
    assert isinstance(error.cause, TimeoutError), error.cause
    assert error.cause.type is TimeoutType.START_TO_CLOSE
    started = [
        e.activity_task_started_event_attributes.attempt
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    ]
    assert started == [1] and hung.attempts == 1
