"""Recorded histories of a group whose trajectories need more than one `write_trajectories`
request (`TRAJECTORY_PARTS_PATCH` in workflows/agent_task.py), replayed on this code:

- `agent_task_trajectory_parts.json.gz`, recorded with the patch: its marker, then a request
  per part;
- `agent_task_trajectories_whole.json.gz`, the same group as the release before the patch wrote
  it: no marker, one request for the whole group (recorded on this code with the patch check
  answering False, which is what that release's commands were).

A replay where either branch is gone fails: written in one request always (the first), or in
parts always (the second: its recorded request is one). Each is replayed on its `branch_only`
copy (tests/workflows/replaying.py): the SDK fails a history holding a patch marker that no
`workflow.patched` asks for, whatever the branch.

The group: 16 episodes of 14 steps, each a call whose brief is the largest a call has (2.4 KB
of a step: tests/workflows/test_agent_task_history_bound.py's `largest_call`), ~540 KB of steps
together, past `EPISODES_BYTES` (no smaller bound can be set without a production knob). Its
history is 3.2 MB of JSON: each file is gzipped (145 KB). Recorded by `test_record` with
`TEMPERED_RECORD_HISTORIES=1`."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory

from infra.storage import ObjectStore
from tests.workflows.harness import ScriptedModel, ScriptedSandbox, connect, running_workers, start
from tests.workflows.replaying import patch_answers, replay, replays_on_its_branch_only
from tests.workflows.test_agent_task_history_bound import largest_call
from tests.workflows.test_episodes import task_input, workers
from workflows.agent_task import TRAJECTORY_PARTS_PATCH, AgentTaskWorkflow

HISTORIES = Path(__file__).parent / "histories"
GROUP, STEPS = 16, 14
"""The smallest group of that call whose steps pass `EPISODES_BYTES` (~540 KB: 2 parts)."""
RECORDED = {  # file → (the id it ran under, whether the patch check answered True)
    "agent_task_trajectory_parts.json.gz": ("parts-fix", True),
    "agent_task_trajectories_whole.json.gz": ("whole-fix", False),
}


def recorded(name: str) -> WorkflowHistory:
    return WorkflowHistory.from_json(
        RECORDED[name][0], json.loads(gzip.decompress((HISTORIES / name).read_bytes()))
    )


def write_requests(history: WorkflowHistory) -> int:
    return sum(
        1
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "write_trajectories"
    )


def has_marker(history: WorkflowHistory) -> bool:
    return any(
        TRAJECTORY_PARTS_PATCH.encode() in e.SerializeToString()
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
    )


@pytest.mark.parametrize("name", sorted(RECORDED))
@pytest.mark.asyncio
async def test_the_recorded_histories_replay(name: str) -> None:
    history = recorded(name)
    patched = RECORDED[name][1]
    assert has_marker(history) is patched
    assert (write_requests(history) > 1) is patched
    await replay(history, AgentTaskWorkflow)


@pytest.mark.parametrize("name", sorted(RECORDED))
@pytest.mark.asyncio
async def test_a_replay_without_the_patch_check_fails(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """`AgentTaskWorkflow._write` without its patch check, on the history's `branch_only` copy
    (tests/workflows/replaying.py): the branch the history took replays, the other fails (a
    group always written in parts, True, or always in one request, False: the release before
    the patch)."""
    taken = RECORDED[name][1]
    await replays_on_its_branch_only(
        monkeypatch, recorded(name), TRAJECTORY_PARTS_PATCH, taken, AgentTaskWorkflow
    )


@pytest.mark.slow  # a recorder: `make test` leaves it out, `make test-all` skips it
@pytest.mark.skipif(not os.environ.get("TEMPERED_RECORD_HISTORIES"), reason="records the histories")
@pytest.mark.parametrize("name", sorted(RECORDED))
@pytest.mark.asyncio
async def test_record(
    temporal_server, namespace, store: ObjectStore, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    workflow_id, patched = RECORDED[name]
    if not patched:  # the release before the patch: it asked nothing, and wrote one request
        patch_answers(monkeypatch, TRAJECTORY_PARTS_PATCH, False)
    client = await connect(temporal_server.address, namespace)
    sandbox = ScriptedSandbox(store, "a")
    task = task_input(store, workflow_id.removesuffix("-fix"), group_size=GROUP, max_turns=STEPS)
    async with running_workers(
        client, {**workers(ScriptedModel(store, largest_call), store), **sandbox.workers()}
    ):
        handle = await start(client, task)
        result = await handle.result()
    assert result.steps == [STEPS] * GROUP
    history = await handle.fetch_history()
    assert has_marker(history) is patched and (write_requests(history) > 1) is patched
    data = WorkflowHistory(workflow_id, history.events).to_json().encode()
    (HISTORIES / name).write_bytes(gzip.compress(data, mtime=0))
