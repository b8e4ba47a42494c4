"""A `code` task shows FEEDBACK in search while it writes its trajectories, and DONE once they are
written (`CODE_FEEDBACK_PATCH` in workflows/agent_task.py), as a `workspace` task does: the
real dev server, S3 and bwrap sandbox, a scripted model, the real trajectory writer held until
the test has looked.

Before, a `code` task's last upsert before DONE was its last step's EXECUTE (its FEEDBACK rode on
the next move's upsert, and there was none): search said EXECUTE while the `status` query said
FEEDBACK. `agent_task_code_feedback.json` is recorded by this test with
`TEMPERED_RECORD_HISTORIES=1` (the patch's marker, then the FEEDBACK upsert), and
`agent_task_code_before_feedback.json` by `test_record_before` as the release before the patch
ran it (no marker, no FEEDBACK upsert: this code with the patch check answering False). A replay
where the check is gone (upserting always, or never) fails on one of them, each replayed on its
`branch_only` copy (`test_a_replay_without_the_patch_check_fails`)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.client import WorkflowHistory

from activities.rewards import RewardActivities
from contracts.names import Activity, Queue, SearchAttr
from contracts.rollout import TaskStatus, WriteTrajectoriesRequest, WriteTrajectoriesResponse
from infra.storage import ObjectStore
from tests.workflows.harness import ScriptedModel, connect, running_workers, start
from tests.workflows.replaying import patch_answers, replay, replays_on_its_branch_only
from tests.workflows.test_agent_task import (
    script,
    settings_for,
    task_input_of,
    task_workers,
    upserted_states,
)
from workflows.agent_task import CODE_FEEDBACK_PATCH, AgentTaskWorkflow
from workflows.search import KEYS

HISTORIES = Path(__file__).parent / "histories"
HISTORY = HISTORIES / "agent_task_code_feedback.json"
BEFORE = HISTORIES / "agent_task_code_before_feedback.json"
WORKFLOW_ID = "code-feedback-add-two"


class HeldWriter:
    """The real trajectory writer, which waits for `release` once it has been called."""

    def __init__(self, store: ObjectStore):
        self.writer = RewardActivities(store)
        self.called, self.release = asyncio.Event(), asyncio.Event()

    @activity.defn(name=Activity.WRITE_TRAJECTORIES.value)
    async def write_trajectories(self, req: WriteTrajectoriesRequest) -> WriteTrajectoriesResponse:
        self.called.set()
        await self.release.wait()
        return await self.writer.write_trajectories(req)


@pytest.mark.asyncio
async def test_a_code_task_shows_feedback_while_it_writes_and_done_after(
    temporal_server, namespace, store: ObjectStore, tmp_path: Path
) -> None:
    settings = settings_for(store, temporal_server.address, namespace, tmp_path)
    client = await connect(temporal_server.address, namespace)
    writer = HeldWriter(store)
    by_queue = task_workers(settings, store, ScriptedModel(store, script))
    by_queue[Queue.REWARDS] = {"activities": [writer.write_trajectories]}
    task = task_input_of("code-feedback", group_size=3, max_turns=2)
    async with running_workers(client, by_queue):
        handle = await start(client, task)
        await asyncio.wait_for(writer.called.wait(), 60)
        writing = await handle.describe()
        status: TaskStatus = await handle.query(AgentTaskWorkflow.status)
        writer.release.set()
        result = await handle.result()
        done = await handle.describe()

    shown = writing.typed_search_attributes
    assert status.state == "FEEDBACK" and shown.get(KEYS[SearchAttr.STATE]) == "FEEDBACK"
    assert shown.get(KEYS[SearchAttr.TURN]) == 1  # the last step's figures, before DONE
    assert shown.get(KEYS[SearchAttr.REWARD]) == 1.0
    assert result.state == "DONE" and done.typed_search_attributes.get(KEYS[SearchAttr.STATE]) == (
        "DONE"
    )
    history = await handle.fetch_history()
    # one upsert more than before, and only one: FEEDBACK, in the workflow task that schedules
    # the write (no workflow task of its own)
    assert upserted_states(history) == ["GENERATE", "EXECUTE"] * 2 + ["FEEDBACK", "DONE"]
    markers = [e for e in history.events if e.HasField("marker_recorded_event_attributes")]
    assert any(CODE_FEEDBACK_PATCH.encode() in e.SerializeToString() for e in markers)
    await replay(history, AgentTaskWorkflow)
    if os.environ.get("TEMPERED_RECORD_HISTORIES"):
        HISTORY.write_text(WorkflowHistory(WORKFLOW_ID, history.events).to_json())


@pytest.mark.slow  # a recorder: `make test` leaves it out, `make test-all` skips it
@pytest.mark.skipif(not os.environ.get("TEMPERED_RECORD_HISTORIES"), reason="records a history")
@pytest.mark.asyncio
async def test_record_before(
    temporal_server, namespace, store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    patch_answers(monkeypatch, CODE_FEEDBACK_PATCH, False)
    settings = settings_for(store, temporal_server.address, namespace, tmp_path)
    client = await connect(temporal_server.address, namespace)
    task = task_input_of("code-feedback", group_size=3, max_turns=2)
    async with running_workers(client, task_workers(settings, store, ScriptedModel(store, script))):
        handle = await start(client, task)
        await handle.result()
    history = await handle.fetch_history()
    assert upserted_states(history) == ["GENERATE", "EXECUTE"] * 2 + ["DONE"]
    BEFORE.write_text(WorkflowHistory(WORKFLOW_ID, history.events).to_json())


@pytest.mark.parametrize(("path", "patched"), [(HISTORY, True), (BEFORE, False)])
@pytest.mark.asyncio
async def test_the_recorded_histories_replay(path: Path, patched: bool) -> None:
    history = WorkflowHistory.from_json(WORKFLOW_ID, json.loads(path.read_text()))
    assert patched is any(
        CODE_FEEDBACK_PATCH.encode() in e.SerializeToString()
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
    )
    last = ["FEEDBACK", "DONE"] if patched else ["EXECUTE", "DONE"]
    assert upserted_states(history)[-2:] == last
    await replay(history, AgentTaskWorkflow)


@pytest.mark.parametrize(("path", "taken"), [(HISTORY, True), (BEFORE, False)])
@pytest.mark.asyncio
async def test_a_replay_without_the_patch_check_fails(
    monkeypatch: pytest.MonkeyPatch, path: Path, taken: bool
) -> None:
    """On its `branch_only` copy (tests/workflows/replaying.py), each history replays with the
    answer it took and fails with the other: the FEEDBACK upsert always (True) or never
    (False: the release before)."""
    history = WorkflowHistory.from_json(WORKFLOW_ID, json.loads(path.read_text()))
    await replays_on_its_branch_only(
        monkeypatch, history, CODE_FEEDBACK_PATCH, taken, AgentTaskWorkflow
    )
