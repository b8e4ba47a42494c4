"""A task cancelled while it closes its sessions, through AgentTaskWorkflow on the real dev server
and real S3 (scripted model and sandbox workers, tests/workflows/harness.py): the close runs to
its end, then the task ends cancelled (`workflows/sessions.py`, `CLOSE_WAITS_PATCH`). Before, the
cancel abandoned the `close_sessions` under way (the SDK's TRY_CANCEL): the worker's activity was
cancelled and the sessions kept their uid slots and workspaces until the worker's TTL.

`sessions_close_cancelled_before62.json.gz` is this scenario recorded on the code before the
patch (`TEMPERED_RECORD_HISTORIES_BEFORE=1` there: its close's cancel requested), and
`sessions_close_waits62.json.gz` on this code (`TEMPERED_RECORD_HISTORIES=1`: its marker)."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import time
import uuid
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.client import WorkflowFailureError, WorkflowHistory
from temporalio.exceptions import CancelledError

from contracts.episode import CloseSessionsRequest, CloseSessionsResponse
from contracts.names import Activity
from infra.storage import ObjectStore
from tests.workflows.harness import ScriptedModel, ScriptedSandbox, connect, running_workers, start
from tests.workflows.replaying import (
    branch_only,
    patch_answers,
    replay,
    replay_failure,
    replays_on_its_branch_only,
)
from tests.workflows.test_episodes import SUBMIT, task_input, workers
from workflows.agent_task import AgentTaskWorkflow
from workflows.sessions import CLOSE_WAITS_PATCH

HISTORIES = Path(__file__).parent / "histories"
AFTER, AFTER_ID = HISTORIES / "sessions_close_waits62.json.gz", "close-waits-62"
BEFORE, BEFORE_ID = HISTORIES / "sessions_close_cancelled_before62.json.gz", "close-cancelled-62"
WAIT_S = 6.0
"""How long the close waits for its cancel (after the task's) before it closes: longer than a
heartbeat's round trip (the task's heartbeat timeout is 5 s: one every 4 s at most)."""


class SlowClose(ScriptedSandbox):
    """A worker whose `close_sessions` heartbeats until its cancel, or for `WAIT_S` once
    `released`, then closes; `log` tells what it did."""

    def __init__(self, store: ObjectStore, name: str):
        super().__init__(store, name)
        self.closing, self.released = asyncio.Event(), asyncio.Event()
        self.log: list[str] = []

    @activity.defn(name=Activity.CLOSE_SESSIONS.value)
    async def close_sessions(self, req: CloseSessionsRequest) -> CloseSessionsResponse:
        self.log.append("close started")
        self.closing.set()
        try:
            await self.released.wait()
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:
                activity.heartbeat()
                await asyncio.sleep(0.2)
        except asyncio.CancelledError:
            self.log.append("close cancelled")
            raise
        self.log.append("close done")
        return await super().close_sessions(req)


def save(path: Path, workflow_id: str, history: WorkflowHistory) -> None:
    path.write_bytes(gzip.compress(WorkflowHistory(workflow_id, history.events).to_json().encode()))


def load(path: Path, workflow_id: str) -> WorkflowHistory:
    return WorkflowHistory.from_json(workflow_id, json.loads(gzip.decompress(path.read_bytes())))


def marked(history: WorkflowHistory) -> bool:
    """Whether `history` holds `CLOSE_WAITS_PATCH`'s marker."""
    markers = [e for e in history.events if e.HasField("marker_recorded_event_attributes")]
    return any(CLOSE_WAITS_PATCH.encode() in e.SerializeToString() for e in markers)


def cancels_requested(history: WorkflowHistory) -> int:
    return sum(
        e.HasField("activity_task_cancel_requested_event_attributes") for e in history.events
    )


@pytest.mark.asyncio
async def test_a_task_cancelled_while_it_closes_its_sessions_closes_them_first(
    temporal_server, namespace, store: ObjectStore
) -> None:
    """Both episodes submit at once; the task is cancelled once its close has started there. The
    close is not cancelled: it closes both sessions, then the task ends cancelled."""
    client = await connect(temporal_server.address, namespace)
    sandbox = SlowClose(store, "a")
    model = ScriptedModel(store, lambda sample, step: SUBMIT)
    task = task_input(store, f"close-{uuid.uuid4().hex[:6]}", group_size=2, max_turns=2)
    async with running_workers(client, {**workers(model, store), **sandbox.workers()}):
        handle = await start(client, task)
        await asyncio.wait_for(sandbox.closing.wait(), 60)
        await handle.cancel()
        for _ in range(150):  # until the workflow took the cancel (or, before, the close did)
            history = await handle.fetch_history()
            if marked(history) or "close cancelled" in sandbox.log:
                break
            await asyncio.sleep(0.2)
        sandbox.released.set()
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), 60)
        history = await handle.fetch_history()
    if os.environ.get("TEMPERED_RECORD_HISTORIES_BEFORE"):  # on the code before the patch
        save(BEFORE, BEFORE_ID, history)

    assert isinstance(failed.value.cause, CancelledError)
    assert sandbox.log == ["close started", "close done"], sandbox.log
    assert not sandbox.sessions and len(sandbox.closed) == 2  # before: both left to the TTL
    assert cancels_requested(history) == 0
    assert marked(history)
    await replay(history, AgentTaskWorkflow)
    if os.environ.get("TEMPERED_RECORD_HISTORIES"):
        save(AFTER, AFTER_ID, history)


@pytest.mark.asyncio
async def test_the_recorded_histories_replay_each_on_its_branch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before the patch the close's cancel was requested (and the task ended at once); with it,
    none: each history replays as recorded, and on its own branch only."""
    before, after = load(BEFORE, BEFORE_ID), load(AFTER, AFTER_ID)
    assert cancels_requested(before) == 1 and cancels_requested(after) == 0
    await replay(before, AgentTaskWorkflow)
    await replay(after, AgentTaskWorkflow)
    await replays_on_its_branch_only(
        monkeypatch, before, CLOSE_WAITS_PATCH, False, AgentTaskWorkflow
    )
    patch_answers(monkeypatch, CLOSE_WAITS_PATCH, True)
    assert await replay_failure(branch_only(after, CLOSE_WAITS_PATCH), AgentTaskWorkflow) == ""
    patch_answers(monkeypatch, CLOSE_WAITS_PATCH, False)  # a cancel asked of the close: the
    failure = await replay_failure(branch_only(after, CLOSE_WAITS_PATCH), AgentTaskWorkflow)
    assert "ActivityTaskStarted" in failure, failure  # SDK finds its start where none may come
