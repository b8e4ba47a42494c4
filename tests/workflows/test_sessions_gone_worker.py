"""A task whose sandbox worker went away, through AgentTaskWorkflow on the real dev server and
real S3 (scripted model and sandbox workers, tests/workflows/harness.py): an episode that ended
on the worker before it went keeps that worker's queue, and the task's close at DONE does not
send it a `close_sessions` (`workflows/sessions.py`, `GONE_PATCH`). Before, it did: nobody
polls that queue, so the task waited out `session_timeout_s` (schedule-to-start) before it
wrote its trajectories, for a close that could close nothing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory

from contracts.episode import ToolCall
from contracts.names import Activity
from contracts.rollout import TaskStatus
from infra.storage import ObjectStore
from tests.workflows.harness import ScriptedModel, ScriptedSandbox, connect, running_workers, start
from tests.workflows.replaying import replay
from tests.workflows.test_episodes import SUBMIT, task_input, workers, write
from workflows.agent_task import AgentTaskWorkflow
from workflows.sessions import GONE_PATCH

BEFORE = Path(__file__).parent / "histories" / "agent_task_workspace_gone_worker_before.json"
"""This file's scenario, recorded on the code before `GONE_PATCH` (its close on sandbox-a)."""


def plan(sample: int, step: int) -> ToolCall:
    """Sample 0 submits at once (it ends on worker a); sample 1 writes, and submits at step 3."""
    if sample == 0 or step == 3:
        return SUBMIT
    return write(f"f{step}.txt", "x")


def closes(history: WorkflowHistory) -> list[str]:
    """The queues the task's `close_sessions` activities were scheduled on."""
    return [
        e.activity_task_scheduled_event_attributes.task_queue.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name
        == Activity.CLOSE_SESSIONS.value
    ]


@pytest.mark.asyncio
async def test_the_close_skips_the_queue_of_a_worker_found_gone(
    temporal_server, namespace, store: ObjectStore
) -> None:
    """Worker a goes away once sample 0 has ended on it; sample 1's step 2 finds it gone and
    is restored on b. The close goes to b alone, and closes sample 1's session there."""
    client = await connect(temporal_server.address, namespace)
    reached, release = asyncio.Event(), asyncio.Event()

    async def gate(step: int) -> None:
        if step == 2:
            reached.set()
            await release.wait()

    model = ScriptedModel(store, plan, gate=gate)
    task = task_input(store, f"gone-{uuid.uuid4().hex[:6]}", group_size=2, max_turns=6)
    first, second = ScriptedSandbox(store, "a"), ScriptedSandbox(store, "b")
    async with running_workers(client, workers(model, store)):
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(running_workers(client, first.workers()))
            handle = await start(client, task)
            await asyncio.wait_for(reached.wait(), 60)
            await stack.aclose()  # worker a is gone: its queue is never polled again
            await stack.enter_async_context(running_workers(client, second.workers()))
            release.set()
            await asyncio.wait_for(handle.result(), 60)
            status: TaskStatus = await handle.query(AgentTaskWorkflow.status)
        history = await handle.fetch_history()

    sessions = [e.session for e in status.samples]
    assert [s.queue if s else None for s in sessions] == [first.queue, second.queue]
    assert closes(history) == [second.queue]  # before: [first.queue, second.queue]
    assert sessions[1] and second.closed == [sessions[1].session_id] and not second.sessions
    patches = [e for e in history.events if e.HasField("marker_recorded_event_attributes")]
    assert any(GONE_PATCH.encode() in e.SerializeToString() for e in patches)  # its marker
    await replay(history, AgentTaskWorkflow)
    if os.environ.get("TEMPERED_RECORD_HISTORIES_BEFORE"):  # on the code before the patch
        BEFORE.write_text(history.to_json())


@pytest.mark.asyncio
async def test_a_history_recorded_before_the_patch_replays() -> None:
    """Its close on the gone worker's queue (and that close's timeout) replay as they ran."""
    history = WorkflowHistory.from_json("gone-1825ca-fix", BEFORE.read_text())
    assert sorted(closes(history)) == ["sandbox-a", "sandbox-b"]
    await replay(history, AgentTaskWorkflow)
