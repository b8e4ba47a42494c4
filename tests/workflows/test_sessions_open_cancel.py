"""A task cancelled during its first `open_sessions` (INIT) waits for the open, and closes the
sessions it opened (`Sessions.open_first`, behind `OPEN_PATCH`), on the real dev server.

FINISHES: the open has opened the group's sessions when the task is cancelled, and returns
before the cancel reaches it (it does not heartbeat again): the workflow learns the sessions
and closes them. Before the patch the task ended at once and they stayed open until the
sandbox worker's TTL.
RACED: the same, but the open's result reaches the workflow in the same workflow task as the
cancel (the workflow worker is away meanwhile): the SDK would raise the cancel over the
result, so the workflow takes what came back before it cancels the open (`Sessions._stop`).
HONOURS: the open heartbeats, sees the cancel, and closes what it opened itself (as
activities/environment.py does), which takes a while: the task ends only after it has.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import CancelledError

from contracts.episode import OpenSessionsRequest, OpenSessionsResponse
from contracts.names import Activity, Queue
from infra.storage import ObjectStore
from tests.workflows.harness import ScriptedModel, ScriptedSandbox, connect, running_workers, start
from tests.workflows.replaying import replay
from tests.workflows.test_episodes import task_input, workers, write
from workflows.agent_task import AgentTaskWorkflow
from workflows.sessions import OPEN_PATCH

HISTORIES = Path(__file__).parent / "histories"
COMPLETED = EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
FINISHES, RACED, HONOURS = "finishes first", "finishes in the cancel's workflow task", "honours"
RECORDED_AS = {
    FINISHES: "agent_task_workspace_open_cancelled.json",
    RACED: "agent_task_workspace_open_raced.json",
}
CLEANUP_S = 1.0
"""How long an open that honours the cancel takes to close what it opened."""


class Opener(ScriptedSandbox):
    """A sandbox worker whose `open_sessions` opens the sessions, then (FINISHES, RACED) waits
    for `release` without heartbeating and returns them, or (HONOURS) heartbeats until it is
    cancelled and then closes them itself."""

    def __init__(self, store: ObjectStore, honours: bool):
        super().__init__(store, "a")
        self.honours = honours
        self.opened_ids: list[str] = []
        self.has_opened, self.release = asyncio.Event(), asyncio.Event()
        self.ended = asyncio.Event()

    @activity.defn(name=Activity.OPEN_SESSIONS.value)
    async def open_sessions(self, req: OpenSessionsRequest) -> OpenSessionsResponse:
        opened = await super().open_sessions(req)
        self.opened_ids += [ref.session_id for ref in opened.sessions.values()]
        self.has_opened.set()
        try:
            if not self.honours:
                await self.release.wait()
                return opened
            while True:
                activity.heartbeat()
                await asyncio.sleep(0.1)
        except asyncio.CancelledError:
            await asyncio.sleep(CLEANUP_S)
            for session_id in self.opened_ids:
                self.sessions.pop(session_id, None)
            raise
        finally:
            self.ended.set()


async def completed_open(handle: WorkflowHandle[Any, Any]) -> None:
    """Wait until the open's completion is in the task's history."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        history = await handle.fetch_history()
        if any(e.event_type == COMPLETED for e in history.events):
            return
        await asyncio.sleep(0.2)
    raise AssertionError("open_sessions did not complete")


async def cancel_during_open(
    client: Client, store: ObjectStore, opener: Opener, way: str
) -> tuple[WorkflowHandle[Any, Any], WorkflowFailureError]:
    """Start a task, cancel it once its open has opened the sessions, and wait for its end."""
    model = ScriptedModel(store, lambda sample, step: write("f.txt", f"{sample}"))
    task = task_input(store, f"open-{uuid.uuid4().hex[:6]}", heartbeat_timeout_s=2.0)
    every = {**workers(model, store), **opener.workers()}
    tasks: dict[Queue | str, Any] = {Queue.AGENT_TASKS: every.pop(Queue.AGENT_TASKS)}
    uncached = {q: {**kwargs, "max_cached_workflows": 0} for q, kwargs in tasks.items()}
    async with running_workers(client, every):  # RACED: none left to evict at the shutdown
        async with running_workers(client, uncached if way == RACED else tasks):
            handle = await start(client, task)
            await asyncio.wait_for(opener.has_opened.wait(), 60)
            if way != RACED:
                await handle.cancel()
                opener.release.set()
                with pytest.raises(WorkflowFailureError) as failed:
                    await asyncio.wait_for(handle.result(), 60)
                return handle, failed.value
        # RACED: the cancel and the open's result wait together for the next workflow worker
        await handle.cancel()
        opener.release.set()
        await completed_open(handle)
        async with running_workers(client, tasks):
            with pytest.raises(WorkflowFailureError) as failed:
                await asyncio.wait_for(handle.result(), 60)
        return handle, failed.value


@pytest.mark.parametrize("way", [FINISHES, RACED, HONOURS])
@pytest.mark.asyncio
async def test_a_task_cancelled_during_its_first_open_closes_what_it_opened(
    temporal_server, namespace, store: ObjectStore, way: str
) -> None:
    opener = Opener(store, honours=way == HONOURS)
    client = await connect(temporal_server.address, namespace)
    handle, failed = await cancel_during_open(client, store, opener, way)
    ended_first = opener.ended.is_set()  # when the task had ended

    assert isinstance(failed.cause, CancelledError)
    assert len(opener.opened_ids) == 3 and opener.sessions == {}, opener.sessions  # none left
    if way == HONOURS:  # the open closed its own, and the task waited for it
        assert ended_first and opener.closed == []
    else:  # the workflow learnt of them and closed them (not the TTL)
        assert sorted(opener.closed) == sorted(opener.opened_ids)
    history = await handle.fetch_history()
    patches = [e for e in history.events if e.HasField("marker_recorded_event_attributes")]
    assert any(OPEN_PATCH.encode() in e.SerializeToString() for e in patches)  # its marker
    await replay(history, AgentTaskWorkflow)
    if way in RECORDED_AS and os.environ.get("TEMPERED_RECORD_HISTORIES"):
        (HISTORIES / RECORDED_AS[way]).write_text(history.to_json())  # test_replay.py replays it
