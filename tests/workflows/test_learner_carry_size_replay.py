"""Recorded histories of a learner that hands on pending groups past `SIGNAL_BYTES` by reference
(`CARRY_PARTS_PATCH`, workflows/learner_carry.py) and stores a step's parts one workflow task at
a time (`SERIAL_PARTS_PATCH`, workflows/learner_request.py), replayed on this code:

- `learner_carry_parts.json.gz`, the first segment: step 0's 2 parts stored one after the other,
  its `train_step`, then the 3 groups left pending stored in 2 parts before it continues as new;
- `learner_carry_read.json.gz`, the segment after it: the 2 parts read back first, the previous
  segment's ledger, then step 1 on the 3 carried groups and one more.

A replay where a patch check is gone fails (`test_a_replay_without_a_patch_check_fails`, on
`branch_only` copies: tests/workflows/replaying.py); the histories before them replay as they
were (test_replay.py, test_learner_request_size_replay.py).
The groups: ~450 KB each (long, repetitive keys, so each file gzips to a few KB), 4 a step.
Recorded by `test_record` with `TEMPERED_RECORD_HISTORIES=1`."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory

from contracts.names import Activity
from infra.storage import ObjectStore
from tests.fixtures.temporal import TemporalServer
from tests.workflows.harness import connect
from tests.workflows.replaying import replay, replays_on_its_branch_only
from tests.workflows.test_learner_carry_size import next_run, start_with_groups, workers
from tests.workflows.test_learner_request_size import GroupsTrainer, scheduled_inputs
from tests.workflows.test_learner_request_size_replay import group_of
from tests.workflows.test_learner_request_size_replay import recorded as step_recorded
from workflows.learner import LearnerWorkflow
from workflows.learner_carry import CARRY_PARTS_PATCH
from workflows.learner_request import SERIAL_PARTS_PATCH

HISTORIES = Path(__file__).parent / "histories"
WORKFLOW_ID = "learner-carry-parts"
PARTS, READ = "learner_carry_parts.json.gz", "learner_carry_read.json.gz"
STEP_PARTS = "learner_step_parts.json.gz"
"""test_learner_request_size_replay.py's: a step's 2 parts stored before `SERIAL_PARTS_PATCH`."""
STORE, LOAD = Activity.STORE_STEP_GROUPS, Activity.LOAD_STEP_GROUPS
EXPECTED = {  # file → (the patches it marks, the activities it scheduled)
    PARTS: (
        {CARRY_PARTS_PATCH, SERIAL_PARTS_PATCH},
        [STORE, STORE, Activity.TRAIN_STEP, STORE, STORE],
    ),
    READ: (
        {SERIAL_PARTS_PATCH},
        [
            LOAD,
            LOAD,
            Activity.RECORD_LEDGER,
            Activity.FIND_CONSUMED,
            STORE,
            STORE,
            Activity.TRAIN_STEP,
            Activity.RECORD_LEDGER,
        ],
    ),
}


def recorded(name: str) -> WorkflowHistory:
    return WorkflowHistory.from_json(
        WORKFLOW_ID, json.loads(gzip.decompress((HISTORIES / name).read_bytes()))
    )


def commands(history: WorkflowHistory) -> tuple[set[str], list[str]]:
    """Which of the two patches `history` marks, and the activities it scheduled."""
    markers = [
        e.SerializeToString()
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
    ]
    marked = {
        p for p in (CARRY_PARTS_PATCH, SERIAL_PARTS_PATCH) if any(p.encode() in m for m in markers)
    }
    return marked, [name for name, _ in scheduled_inputs(list(history.events))]


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.asyncio
async def test_the_recorded_histories_replay(name: str) -> None:
    history = recorded(name)
    assert commands(history) == EXPECTED[name]
    await replay(history, LearnerWorkflow)


@pytest.mark.parametrize(
    ("patch", "name", "taken"),
    [(CARRY_PARTS_PATCH, PARTS, True), (SERIAL_PARTS_PATCH, STEP_PARTS, False)],
)
@pytest.mark.asyncio
async def test_a_replay_without_a_patch_check_fails(
    monkeypatch: pytest.MonkeyPatch,
    patch: str,
    name: str,
    taken: bool,
) -> None:
    """On its `branch_only` copy (tests/workflows/replaying.py), a history replays with
    `workflow.patched(patch)` answering the branch it took, and fails with the other: the
    pending groups go inline (False, the release before `CARRY_PARTS_PATCH`); a step's parts,
    scheduled all at once before `SERIAL_PARTS_PATCH` (test_learner_request_size_replay.py's
    history), one workflow task at a time (True).

    `SERIAL_PARTS_PATCH`'s histories (`PARTS`, `READ`) hold no branch: scheduled all at once
    (False), their parts' commands match theirs, one workflow task early, and they replay."""
    history = step_recorded(name) if name == STEP_PARTS else recorded(name)
    await replays_on_its_branch_only(monkeypatch, history, patch, taken, LearnerWorkflow)


@pytest.mark.slow  # a recorder: `make test` leaves it out, `make test-all` skips it
@pytest.mark.skipif(not os.environ.get("TEMPERED_RECORD_HISTORIES"), reason="records the histories")
@pytest.mark.asyncio
async def test_record(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore, tmp_path: Path
) -> None:
    """Step 0 takes 4 of 7 groups signalled before any worker polls; the segment (one step a
    segment) continues as new with 3 pending (~1.35 MB, past `SIGNAL_BYTES`); the next, given
    one more group, trains step 1 and ends."""
    groups = [group_of(i) for i in range(8)]
    client = await connect(temporal_server.address, namespace)
    trainer = GroupsTrainer(store)
    handle = await start_with_groups(
        client, WORKFLOW_ID, groups[:-1], step=4, per_signal=2, max_steps=2, steps_per_run=1
    )
    assert handle.result_run_id is not None
    async with workers(client, store, tmp_path, trainer):
        second = await next_run(client, handle.id, handle.result_run_id)
        await handle.signal(LearnerWorkflow.add_groups, groups[-1:])
        await asyncio.wait_for(client.get_workflow_handle(handle.id).result(), 60)
    assert trainer.steps == {0: groups[:4], 1: groups[4:]}
    for name, run_id in ((PARTS, handle.result_run_id), (READ, second)):
        history = await client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        assert commands(history) == EXPECTED[name]
        data = WorkflowHistory(WORKFLOW_ID, history.events).to_json().encode()
        (HISTORIES / name).write_bytes(gzip.compress(data, mtime=0))
