"""A learner that ends at `max_steps` carries the groups signalled while it writes its ledger and
while its `learner_done` is out, on the dev server with the real `store_step_groups`,
`load_step_groups` and ledger activities on a real S3 (`train_step` a stand-in that reads its
groups as the real one does).

It carried its pending groups first, then wrote its ledger, then signalled `learner_done`:
groups that came during the write (or the signal's retries, which sent the state as it had
grown) stayed inline, and three ~0.9 MB signals put the `learner_done` (and the result) past
Temporal's 2 MiB: the workflow task was refused (TMPRL1103) on every retry, the learner RUNNING
for ever. Now (`CARRY_LAST_PATCH`, workflows/learner_carry.py) it writes its ledger first and
carries last, signals a copy of the state as carried, and carries again before returning.

Each test: 4 groups a step, step 0 trains the 4 sent first, then 5 of ~450 KB (~2.25 MB, in 3
signals) come while the learner ends. `learner_fix60b_carry_last.json.gz` is the first test's
history, replayed here (`test_record` records it, with `TEMPERED_RECORD_HISTORIES=1`)."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowHistory

from activities.ledger import LedgerActivities
from activities.stored import read_model
from contracts.common import ObjectRef
from contracts.learner import (
    LearnerDone,
    LearnerInput,
    LearnerProgress,
    LedgerSegment,
    StepGroups,
    TrajectoryGroup,
)
from contracts.names import Activity, Queue, Signal
from infra import keys
from infra.storage import ObjectStore
from tests.fixtures.temporal import TemporalServer
from tests.workflows.harness import connect
from tests.workflows.replaying import replay, replays_on_its_branch_only
from tests.workflows.test_learner_carry_size import WAIT_S, CarryParent, start_with_groups
from tests.workflows.test_learner_carry_size import task_failure as failed_task
from tests.workflows.test_learner_carry_size import workers as carry_workers
from tests.workflows.test_learner_request_size import GroupsTrainer, payload_bytes, scheduled_inputs
from tests.workflows.test_learner_request_size_replay import group_of
from workflows.learner import LearnerWorkflow
from workflows.learner_carry import CARRY_LAST_PATCH

STEP = 4
"""Groups a step: step 0's, sent first."""
BURST = [group_of(i) for i in range(STEP, STEP + 5)]
"""Sent while the learner ends (~2.25 MB, in 3 signals of 2, 2 and 1)."""
HISTORIES = Path(__file__).parent / "histories"
HISTORY = "learner_fix60b_carry_last.json.gz"
RECORDED_ID = "learner-carry-last"
STORE = Activity.STORE_STEP_GROUPS
RECORDED_ACTIVITIES = [
    STORE,
    STORE,
    Activity.TRAIN_STEP,
    Activity.RECORD_LEDGER,
    STORE,
    STORE,
    STORE,
]
"""The recorded run's: step 0 (its groups in 2 parts), its ledger, then the 5 groups signalled
meanwhile in 3 parts."""


async def send_burst(client: Client, workflow_id: str) -> None:
    learner = client.get_workflow_handle(workflow_id)
    for first in range(0, len(BURST), 2):
        await learner.signal(LearnerWorkflow.add_groups, BURST[first : first + 2])


@asynccontextmanager
async def workers(
    client: Client,
    store: ObjectStore,
    home: Path,
    trainer: GroupsTrainer,
    while_writing: Callable[[], Awaitable[None]] | None = None,
) -> AsyncIterator[None]:
    """The learner's and its parent's workers; the ledger's write runs `while_writing` first."""
    ledger = LedgerActivities(store)

    @activity.defn(name=Activity.RECORD_LEDGER.value)
    async def record_ledger(segment: LedgerSegment) -> ObjectRef:
        if while_writing is not None:
            await while_writing()
        return await ledger.record_ledger(segment)

    async with carry_workers(
        client, store, home, trainer, workflows=[GoneParent], record_ledger=record_ledger
    ):
        yield


async def ended(client: Client, handle: WorkflowHandle[LearnerWorkflow, LearnerInput]) -> None:
    """Wait for the learner to end; fail with its workflow task's failure if one comes."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        described = await client.get_workflow_handle(handle.id).describe()
        if described.close_time is not None:
            return
        failure = await failed_task(client, handle.id, described.run_id)
        assert failure is None, f"the learner could not end: {failure}"
        await asyncio.sleep(0.3)
    pytest.fail("the learner never ended")


def stored(store: ObjectStore, final: LearnerInput) -> list[TrajectoryGroup]:
    """The groups `final` names by reference, in order."""
    return [
        group
        for ref in final.pending_parts
        for group in read_model(store, "pending_parts", ref, StepGroups).groups
    ]


def ledger_ids(store: ObjectStore, run_id: str) -> list[str]:
    prefix = keys.learner_ledger_prefix(run_id)
    return [
        task
        for key in store.list_keys(prefix)
        for task in store.get_model(key, LedgerSegment).consumed
    ]


async def run_burst_in_ledger_write(
    client: Client, store: ObjectStore, home: Path, workflow_id: str
) -> tuple[LearnerInput, LearnerDone, WorkflowHandle[LearnerWorkflow, LearnerInput]]:
    trainer = GroupsTrainer(store)
    parent = await client.start_workflow(
        CarryParent.run, id=f"{workflow_id}-parent", task_queue=Queue.AGENT_TASKS.value
    )
    handle = await start_with_groups(
        client, workflow_id, [group_of(i) for i in range(STEP)], step=STEP, per_signal=2,
        max_steps=1, parent_workflow_id=parent.id,
    )  # fmt: skip

    async with workers(client, store, home, trainer, lambda: send_burst(client, workflow_id)):
        await ended(client, handle)
        final = await handle.result()
        done = await asyncio.wait_for(parent.result(), WAIT_S)
    assert trainer.steps == {0: [group_of(i) for i in range(STEP)]}
    return final, done, handle


@pytest.mark.asyncio
async def test_groups_signalled_while_the_last_ledger_is_written_go_by_reference(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore, tmp_path: Path
) -> None:
    """The 5 groups of the burst that came during the ledger's write are carried in 3 parts:
    the `learner_done` and the result name them, each within a payload, and are the same."""
    client = await connect(temporal_server.address, namespace)
    final, done, handle = await run_burst_in_ledger_write(client, store, tmp_path, "carry-last")
    assert done.final is not None and done.final.model_dump() == final.model_dump()
    assert (final.step, final.pending, final.consumed) == (1, [], [])
    assert payload_bytes(final) < 64 * 1024 and payload_bytes(done) < 64 * 1024
    assert stored(store, final) == BURST
    assert ledger_ids(store, final.run_id) == [f"t{i}" for i in range(STEP)]
    history = await handle.fetch_history()
    assert [name for name, _ in scheduled_inputs(list(history.events))] == RECORDED_ACTIVITIES


@pytest.mark.asyncio
async def test_groups_signalled_while_learner_done_is_retried_go_by_reference(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore, tmp_path: Path
) -> None:
    """The parent has ended when the learner ends: `learner_done` is retried (a timer between
    tries) until a new run under its id comes. The burst that comes meanwhile is not in the state
    signalled (a retry sent the state as it had grown: past 2 MiB), and the result carries it
    by reference."""
    client = await connect(temporal_server.address, namespace)
    trainer = GroupsTrainer(store)
    parent_id = "carry-last-late-parent"
    await client.start_workflow(GoneParent.run, id=parent_id, task_queue=Queue.AGENT_TASKS.value)
    handle = await start_with_groups(
        client, "carry-last-late", [group_of(i) for i in range(STEP)], step=STEP, per_signal=2,
        max_steps=1, parent_workflow_id=parent_id,
    )  # fmt: skip

    async def parent_gone() -> None:  # before the learner tells it (as it ends: its ledger)
        gone = client.get_workflow_handle(parent_id)
        await asyncio.wait_for(gone.result(), WAIT_S)

    async with workers(client, store, tmp_path, trainer, parent_gone):
        await done_failed(client, handle.id)
        await send_burst(client, handle.id)
        parent = await client.start_workflow(
            CarryParent.run, id=parent_id, task_queue=Queue.AGENT_TASKS.value
        )
        await ended(client, handle)
        final = await handle.result()
        done = await asyncio.wait_for(parent.result(), WAIT_S)
    assert done.final is not None and done.final.pending_parts == []
    assert (done.final.step, done.final.pending, done.final.consumed) == (1, [], [])
    assert (final.step, final.pending) == (1, [])
    assert payload_bytes(final) < 64 * 1024 and payload_bytes(done) < 64 * 1024
    assert stored(store, final) == BURST


@workflow.defn(name="GoneParent", sandboxed=False)
class GoneParent:
    """A parent that ends once told the learner's progress: its `learner_done` finds no run."""

    def __init__(self) -> None:
        self.told = False

    @workflow.run
    async def run(self) -> None:
        await workflow.wait_condition(lambda: self.told)

    @workflow.signal(name=Signal.LEARNER_PROGRESS)
    def learner_progress(self, progress: LearnerProgress) -> None:
        self.told = True


async def done_failed(client: Client, workflow_id: str) -> None:
    """Wait until the learner's `learner_done` found no parent (it retries after a timer)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        events = (await client.get_workflow_handle(workflow_id).fetch_history()).events
        initiated = {
            e.event_id
            for e in events
            if e.signal_external_workflow_execution_initiated_event_attributes.signal_name
            == Signal.LEARNER_DONE
        }
        if any(
            e.signal_external_workflow_execution_failed_event_attributes.initiated_event_id
            in initiated
            for e in events
            if e.event_type == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED
        ):
            return
        await asyncio.sleep(0.1)
    pytest.fail("the learner's learner_done never failed")


def recorded() -> WorkflowHistory:
    data = json.loads(gzip.decompress((HISTORIES / HISTORY).read_bytes()))
    return WorkflowHistory.from_json(RECORDED_ID, data)


@pytest.mark.asyncio
async def test_the_recorded_history_replays() -> None:
    history = recorded()
    markers = [
        e.SerializeToString()
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
    ]
    assert any(CARRY_LAST_PATCH.encode() in marker for marker in markers)
    assert [name for name, _ in scheduled_inputs(list(history.events))] == RECORDED_ACTIVITIES
    await replay(history, LearnerWorkflow)


@pytest.mark.asyncio
async def test_a_replay_without_the_patch_check_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """On its `branch_only` copy (tests/workflows/replaying.py), the history replays with
    `workflow.patched(CARRY_LAST_PATCH)` answering True, and not with False (the release before
    it): it carries first, and signals the burst inline instead of storing it."""
    await replays_on_its_branch_only(
        monkeypatch, recorded(), CARRY_LAST_PATCH, True, LearnerWorkflow
    )


@pytest.mark.slow  # a recorder: `make test` leaves it out, `make test-all` skips it
@pytest.mark.skipif(not os.environ.get("TEMPERED_RECORD_HISTORIES"), reason="records the history")
@pytest.mark.asyncio
async def test_record(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore, tmp_path: Path
) -> None:
    client = await connect(temporal_server.address, namespace)
    await run_burst_in_ledger_write(client, store, tmp_path, RECORDED_ID)
    history = await client.get_workflow_handle(RECORDED_ID).fetch_history()
    data = WorkflowHistory(RECORDED_ID, history.events).to_json().encode()
    (HISTORIES / HISTORY).write_bytes(gzip.compress(data, mtime=0))
