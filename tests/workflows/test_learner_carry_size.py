"""The state a learner carries out of a segment stays within a payload when its pending groups
do not, on the dev server with the real `store_step_groups`, `load_step_groups` and ledger
activities on a real S3 (`train_step` a stand-in that reads its groups as the real one does).

At G = 256 a group is ~45 KB of refs (tests/workflows/test_learner_request_size.py). A segment
that continued as new with 63 of a step's 64 groups pending (no whole batch, so it does not
train first) carried ~2.8 MB in its next input, and one that ended at `max_steps` with them
left over carried them in its `learner_done` and its result: each past Temporal's 2 MiB, the
workflow task failed on every retry (the learner RUNNING for ever). Now (`CARRY_PARTS_PATCH`,
workflows/learner_carry.py) they are stored in parts and named in `pending_parts`; the next
segment reads them back first thing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowHandle, WorkflowHistory
from temporalio.worker import Worker

from activities.learner import LearnerActivities
from activities.ledger import LedgerActivities
from activities.stored import read_model
from contracts.learner import (
    GRPOConfig,
    HistoryBudget,
    LearnerDone,
    LearnerInput,
    LearnerProgress,
    StepGroups,
    TrajectoryGroup,
)
from contracts.names import Activity, Queue, Signal
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.fixtures.temporal import TemporalServer
from tests.workflows.harness import connect
from tests.workflows.test_learner_request_size import (
    PER_SIGNAL,
    RUN,
    GroupsTrainer,
    large_group,
    payload_bytes,
    run_learner,
    scheduled_inputs,
)
from workflows.budget import PAYLOAD_LIMIT
from workflows.learner import LearnerWorkflow
from workflows.step_slots import SIGNAL_BYTES

STEP = 64
"""Groups a step (`groups_per_step`): 63 of them pass a payload (~2.8 MB)."""
WAIT_S = 60.0


@workflow.defn(name="CarryParent", sandboxed=False)  # this module imports the activities
class CarryParent:
    """The learner's parent as the run is to it: takes `learner_progress`, returns the
    `learner_done` it is told."""

    def __init__(self) -> None:
        self.done: LearnerDone | None = None

    @workflow.run
    async def run(self) -> LearnerDone:
        await workflow.wait_condition(lambda: self.done is not None)
        assert self.done is not None
        return self.done

    @workflow.signal(name=Signal.LEARNER_DONE)
    def learner_done(self, done: LearnerDone) -> None:
        self.done = done

    @workflow.signal(name=Signal.LEARNER_PROGRESS)
    def learner_progress(self, progress: LearnerProgress) -> None:
        del progress


@asynccontextmanager
async def workers(
    client: Client,
    store: ObjectStore,
    home: Path,
    trainer: GroupsTrainer,
    *,
    workflows: Sequence[type] = (),
    store_step_groups: Callable[..., Any] | None = None,
    record_ledger: Callable[..., Any] | None = None,
) -> AsyncIterator[None]:
    """The learner's and its parent's workflow worker (and `workflows`), and its activities'
    workers: the real ones, but a test's stand-ins for `store_step_groups` or `record_ledger`."""
    ledger = LedgerActivities(store)
    learner = LearnerActivities(Settings(home=home), store)
    async with (
        Worker(
            client,
            task_queue=Queue.AGENT_TASKS.value,
            workflows=[LearnerWorkflow, CarryParent, *workflows],
        ),
        Worker(
            client,
            task_queue=Queue.LEARNER.value,
            activities=[
                trainer.train_step,
                store_step_groups or learner.store_step_groups,
                learner.load_step_groups,
            ],
        ),
        Worker(
            client,
            task_queue=Queue.REWARDS.value,
            activities=[record_ledger or ledger.record_ledger, ledger.find_consumed],
        ),
    ):
        yield


async def start_with_groups(
    client: Client,
    workflow_id: str,
    groups: list[TrajectoryGroup],
    *,
    step: int = STEP,
    per_signal: int = PER_SIGNAL,
    **state: object,
) -> WorkflowHandle[LearnerWorkflow, LearnerInput]:
    """A learner of `step` groups a step that finds `groups` signalled (`per_signal` at a time)
    when it first runs, if no worker polls yet."""
    handle = await client.start_workflow(
        LearnerWorkflow.run,
        LearnerInput(
            run_id=RUN,
            config=GRPOConfig(groups_per_step=step),
            budget=HistoryBudget(bytes=50 * 1024 * 1024),  # continue-as-new by steps alone
            burst=per_signal,
            **state,  # type: ignore[arg-type]
        ),
        id=workflow_id,
        task_queue=Queue.AGENT_TASKS.value,
    )
    for first in range(0, len(groups), per_signal):
        await handle.signal(LearnerWorkflow.add_groups, groups[first : first + per_signal])
    return handle


DEADLOCK = "TMPRL1101"
"""The SDK's deadlock detector (a workflow task past 2 s): a loaded host's, which the server
retries; not the refusal these tests look for (TMPRL1103, a payload too large: for good)."""


async def task_failure(client: Client, workflow_id: str, run_id: str) -> str | None:
    """The message of the last workflow task failure of that run, if any."""
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    failures = [  # not those of a task that new events overtook (signals): it runs again
        e.workflow_task_failed_event_attributes.failure.message
        for e in history.events
        if e.HasField("workflow_task_failed_event_attributes")
        and e.workflow_task_failed_event_attributes.failure.message
        and DEADLOCK not in e.workflow_task_failed_event_attributes.failure.message
    ]
    return failures[-1] if failures else None


async def next_run(client: Client, workflow_id: str, run_id: str) -> str:
    """The run that run `run_id` continued as new into (the test fails if its workflow task
    fails instead: the state it carries was refused)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        latest = (await client.get_workflow_handle(workflow_id).describe()).run_id
        if latest != run_id:
            return latest
        failure = await task_failure(client, workflow_id, run_id)
        if failure is not None:
            pytest.fail(f"the segment could not continue as new: {failure}")
        await asyncio.sleep(0.5)
    pytest.fail("the segment never continued as new")


async def ended(client: Client, handle: WorkflowHandle[LearnerWorkflow, LearnerInput]) -> None:
    """Wait for the learner's last run to end (fail if its workflow task fails)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        described = await client.get_workflow_handle(handle.id).describe()
        if described.close_time is not None:
            return
        failure = await task_failure(client, handle.id, described.run_id)
        if failure is not None:
            pytest.fail(f"the learner could not end: {failure}")
        await asyncio.sleep(0.5)
    pytest.fail("the learner never ended")


def task_bytes(history: WorkflowHistory) -> list[int]:
    """Per workflow task of `history`, the bytes of the activity inputs it scheduled and of the
    activity results it was woken by: what one of its transactions holds of groups."""
    tasks: list[int] = [0]
    for event in history.events:
        if event.HasField("workflow_task_completed_event_attributes"):
            tasks.append(0)
        elif event.HasField("activity_task_scheduled_event_attributes"):
            tasks[-1] += event.activity_task_scheduled_event_attributes.input.ByteSize()
        elif event.HasField("activity_task_completed_event_attributes"):
            tasks[-1] += event.activity_task_completed_event_attributes.result.ByteSize()
    return tasks


def continued_input_bytes(history: WorkflowHistory) -> int:
    (event,) = [
        e
        for e in history.events
        if e.HasField("workflow_execution_continued_as_new_event_attributes")
    ]
    return event.workflow_execution_continued_as_new_event_attributes.input.ByteSize()


@pytest.mark.asyncio
async def test_a_segment_continues_as_new_with_groups_past_a_payload_pending(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore, tmp_path: Path
) -> None:
    """Step 0 takes 64 of 127 groups; the segment (one step a segment) continues as new with 63
    pending, ~2.8 MB: they go by reference, the next segment reads them back and, given one more
    group, trains step 1 on the 64 in order."""
    groups = [large_group(i) for i in range(2 * STEP)]
    assert payload_bytes(groups[STEP : 2 * STEP - 1]) > PAYLOAD_LIMIT
    client = await connect(temporal_server.address, namespace)
    trainer = GroupsTrainer(store)
    handle = await start_with_groups(
        client, "learner-carry", groups[:-1], max_steps=2, steps_per_run=1
    )
    first_run = handle.result_run_id
    assert first_run is not None
    async with workers(client, store, tmp_path, trainer):
        await next_run(client, handle.id, first_run)
        await handle.signal(LearnerWorkflow.add_groups, groups[-1:])
        final = await asyncio.wait_for(
            client.get_workflow_handle_for(LearnerWorkflow.run, handle.id).result(), WAIT_S
        )
    assert (final.step, final.pending, final.pending_parts) == (2, [], [])
    assert trainer.steps == {0: groups[:STEP], 1: groups[STEP:]}  # each once, in order
    history = await client.get_workflow_handle(handle.id, run_id=first_run).fetch_history()
    assert continued_input_bytes(history) < 64 * 1024
    inputs = scheduled_inputs(list(history.events))
    after_step = [name for name, _ in inputs][
        inputs.index(next(i for i in inputs if i[0] == Activity.TRAIN_STEP)) + 1 :
    ]
    assert after_step == [Activity.STORE_STEP_GROUPS] * 3, inputs  # 2.8 MB in parts of 1 MiB
    assert max(size for name, size in inputs if name == Activity.STORE_STEP_GROUPS) <= (
        SIGNAL_BYTES + 4096
    )
    second = await client.get_workflow_handle(handle.id).fetch_history()
    loads = [name for name, _ in scheduled_inputs(list(second.events))]
    assert loads[:3] == [Activity.LOAD_STEP_GROUPS] * 3, loads
    for segment in (history, second):  # a part a task, read back or stored
        assert max(task_bytes(segment)) <= SIGNAL_BYTES + 4096, task_bytes(segment)


@pytest.mark.asyncio
async def test_a_step_stores_its_parts_one_workflow_task_at_a_time(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore, tmp_path: Path
) -> None:
    """A step of 64 groups (~2.9 MB) stores its 3 parts one workflow task at a time: scheduled
    all at once, they passed the server's 4 MiB transaction with the ~0.9 MB signals buffered
    meanwhile, and the server terminated the learner ("Transaction size exceeds limit")."""
    groups = [large_group(i) for i in range(STEP)]
    client = await connect(temporal_server.address, namespace)
    final, trainer, history = await run_learner(client, store, tmp_path, "learner-serial", groups)
    assert final.step == 1 and trainer.steps[0] == groups
    parts = [name for name, _ in scheduled_inputs(list(history.events))]
    assert parts.count(Activity.STORE_STEP_GROUPS) == 3, parts
    assert max(task_bytes(history)) <= SIGNAL_BYTES + 4096, task_bytes(history)


@pytest.mark.asyncio
async def test_a_learner_ends_with_groups_past_a_payload_left_over(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore, tmp_path: Path
) -> None:
    """At `max_steps` with 63 groups left over (~2.8 MB), its `learner_done` and its result name
    them by reference: both within a payload, and the groups readable where they point."""
    groups = [large_group(i) for i in range(2 * STEP - 1)]
    client = await connect(temporal_server.address, namespace)
    trainer = GroupsTrainer(store)
    async with workers(client, store, tmp_path, trainer):
        parent = await client.start_workflow(
            CarryParent.run, id="carry-parent", task_queue=Queue.AGENT_TASKS.value
        )
        handle = await start_with_groups(
            client, "learner-leftovers", groups, max_steps=1, parent_workflow_id=parent.id
        )
        await ended(client, handle)
        final = await handle.result()
        done = await asyncio.wait_for(parent.result(), WAIT_S)
    assert done.final is not None and done.final.model_dump() == final.model_dump()
    assert (final.step, final.pending) == (1, [])
    assert payload_bytes(final) < 64 * 1024
    assert len(final.pending_parts) == 3
    left = [
        g
        for ref in final.pending_parts
        for g in read_model(store, "pending_parts", ref, StepGroups).groups
    ]
    assert left == groups[STEP:]
