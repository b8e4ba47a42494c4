"""Sessions whose live worker failed their step `STEP_ATTEMPTS` times are closed there before
they are restored elsewhere, through AgentTaskWorkflow on the real dev server and real S3
(scripted model and sandbox workers, tests/workflows/harness.py; `workflows/sessions.py`,
`CLOSE_FAILED_PATCH`). Before, the restore replaced each episode's session and nothing closed
the old ones: they kept their uid slots and workspaces on the broken worker until its TTL.
The close is one attempt bounded by `CLOSE_FAILED_WITHIN` (test_sessions62b_close_bound.py).

`sessions_lost_closed62.json.gz` is this scenario recorded on this code (its marker,
`TEMPERED_RECORD_HISTORIES=1`); the one before the patch is
`agent_task_workspace_broken_host.json` (test_sessions_infra_steps.py)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import os
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory

from contracts.names import Activity, Queue
from contracts.rollout import AgentTaskResult, TaskStatus
from infra.storage import ObjectStore
from tests.workflows.harness import ScriptedModel, ScriptedSandbox, connect, running_workers, start
from tests.workflows.replaying import replay, replays_on_its_branch_only
from tests.workflows.test_episodes import task_input, workers
from tests.workflows.test_sessions_infra_steps import HISTORY as BEFORE
from tests.workflows.test_sessions_infra_steps import HISTORY_ID as BEFORE_ID
from tests.workflows.test_sessions_infra_steps import BrokenHost, end_of, plan
from workflows.agent_task import AgentTaskWorkflow
from workflows.sessions import CLOSE_FAILED_PATCH, CLOSE_FAILED_WITHIN, STEP_ATTEMPTS

AFTER = Path(__file__).parent / "histories" / "sessions_lost_closed62.json.gz"
AFTER_ID = "lost-closed-62"


def scheduled(history: WorkflowHistory) -> list[tuple[str, str]]:
    """Each scheduled session activity, with its queue."""
    names = {a.value for a in (Activity.OPEN_SESSIONS, Activity.CLOSE_SESSIONS)}
    events = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    return [
        (e.activity_type.name, e.task_queue.name) for e in events if e.activity_type.name in names
    ]


def failed_close(history: WorkflowHistory, queue: str) -> tuple[int, timedelta]:
    """The close scheduled on `queue`'s attempts and schedule-to-close timeout."""
    (close,) = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.task_queue.name == queue
        and e.activity_task_scheduled_event_attributes.activity_type.name
        == Activity.CLOSE_SESSIONS.value
    ]
    return close.retry_policy.maximum_attempts, close.schedule_to_close_timeout.ToTimedelta()


async def first_attempt(host: BrokenHost) -> None:
    while not host.attempts:
        await asyncio.sleep(0.2)


def load(path: Path, workflow_id: str) -> WorkflowHistory:
    data = path.read_bytes()
    text = gzip.decompress(data) if path.name.endswith(".gz") else data
    return WorkflowHistory.from_json(workflow_id, json.loads(text))


@pytest.mark.asyncio
async def test_sessions_a_live_worker_failed_are_closed_there_before_the_restore(
    temporal_server, namespace, store: ObjectStore
) -> None:
    """Worker a opens both sessions and fails their first step `STEP_ATTEMPTS` times; b then
    takes the restore. a's two sessions are closed on a's queue before the restore's open, and
    the episodes end on b, whose sessions the task closes at its end."""
    client = await connect(temporal_server.address, namespace)
    broken, good = BrokenHost(store, "a"), ScriptedSandbox(store, "b")
    model = ScriptedModel(store, plan)
    task = task_input(store, f"lost-{uuid.uuid4().hex[:6]}", group_size=2, max_turns=3)
    shared, own = broken.workers()[Queue.SANDBOX], broken.workers()[broken.queue]
    async with (
        running_workers(client, {**workers(model, store), broken.queue: own}),
        contextlib.AsyncExitStack() as stack,
    ):
        await stack.enter_async_context(running_workers(client, {Queue.SANDBOX: shared}))
        handle = await start(client, task)
        await asyncio.wait_for(first_attempt(broken), 60)
        await stack.aclose()  # a no longer takes opens; its own queue fails steps, closes
        await stack.enter_async_context(running_workers(client, good.workers()))
        result = await end_of(handle, broken, 90)
        status: TaskStatus = await handle.query(AgentTaskWorkflow.status)
    history = await handle.fetch_history()

    assert isinstance(result, AgentTaskResult), result
    assert result.solved == [True, True]
    assert list(broken.attempts.values()) == [STEP_ATTEMPTS]
    assert not broken.sessions and len(broken.closed) == 2  # before: both left to the TTL
    assert all(e.session and e.session.queue == good.queue for e in status.samples)
    assert not good.sessions and len(good.closed) == 2
    open_, close = Activity.OPEN_SESSIONS.value, Activity.CLOSE_SESSIONS.value
    assert scheduled(history) == [
        (open_, Queue.SANDBOX.value),
        (close, broken.queue),  # before the restore
        (open_, Queue.SANDBOX.value),
        (close, good.queue),
    ]
    assert failed_close(history, broken.queue) == (1, CLOSE_FAILED_WITHIN)  # one bounded try
    await replay(history, AgentTaskWorkflow)
    if os.environ.get("TEMPERED_RECORD_HISTORIES"):
        AFTER.write_bytes(
            gzip.compress(WorkflowHistory(AFTER_ID, history.events).to_json().encode())
        )


@pytest.mark.asyncio
async def test_histories_either_side_of_the_patch_replay_on_their_branch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before, after = load(BEFORE, BEFORE_ID), load(AFTER, AFTER_ID)
    assert [q for _, q in scheduled(before)].count("sandbox-a") == 0
    assert [q for _, q in scheduled(after)].count("sandbox-a") == 1
    assert failed_close(after, "sandbox-a") == (1, CLOSE_FAILED_WITHIN)  # recorded on this code
    await replay(before, AgentTaskWorkflow)
    await replay(after, AgentTaskWorkflow)
    await replays_on_its_branch_only(
        monkeypatch, before, CLOSE_FAILED_PATCH, False, AgentTaskWorkflow
    )
    await replays_on_its_branch_only(
        monkeypatch, after, CLOSE_FAILED_PATCH, True, AgentTaskWorkflow
    )
