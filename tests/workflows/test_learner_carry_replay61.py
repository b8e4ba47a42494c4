"""A learner's carry makes its second and later rounds behind a patch of their own
(`CARRY_AGAIN_PATCH`, workflows/learner_carry.py), and histories on both sides of it replay.

The carry's rounds were asked with `CARRY_PARTS_PATCH` alone, and `workflow.patched` answers a
patch once a run: a history recorded when the carry made one round (groups signalled during its
stores went inline, fine up to 2 MiB) made a second round where it holds its continue-as-new, and
failed to replay (TMPRL1100) on every retry of the workflow task: the learner RUNNING for ever
after a worker restart. Those histories are test_replay.py's `learner_carry_one_round_before.json.gz`
(it continued as new) and `learner_carry_one_round_end_before.json.gz` (it ended at `max_steps`:
a second round where it holds its `LEDGER_PATCH` marker and `record_ledger`).

`learner_carry_rounds.json.gz` is this code's: test_learner_carry_burst.py's run, one step a
segment, whose first segment stores step 0's 2 parts, trains, stores the 3 groups left pending
in 2 parts while 5 more (~2.25 MB) are signalled, and stores those in 3 more parts (the patch's
marker). Recorded by `test_record` with `TEMPERED_RECORD_HISTORIES=1`."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory

from activities.learner import LearnerActivities
from contracts.names import Activity
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.fixtures.temporal import TemporalServer
from tests.workflows.harness import connect
from tests.workflows.replaying import replay, replays_on_its_branch_only
from tests.workflows.test_learner_carry_burst import (
    FIRST,
    GROUPS,
    STEP,
    GatedStore,
    burst_while_carrying,
)
from tests.workflows.test_learner_carry_size import WAIT_S, next_run, start_with_groups, workers
from tests.workflows.test_learner_request_size import GroupsTrainer, scheduled_inputs
from workflows.learner import LearnerWorkflow
from workflows.learner_carry import CARRY_AGAIN_PATCH, CARRY_PARTS_PATCH
from workflows.learner_request import SERIAL_PARTS_PATCH

HISTORIES = Path(__file__).parent / "histories"
ROUNDS, ROUNDS_ID = "learner_carry_rounds.json.gz", "carry-rounds"
BEFORE, BEFORE_ID = "learner_carry_one_round_before.json.gz", "r1-carry-old"
END, END_ID = "learner_carry_one_round_end_before.json.gz", "r1-carry-end-old"
PATCHES = (CARRY_PARTS_PATCH, CARRY_AGAIN_PATCH, SERIAL_PARTS_PATCH)
STORE = Activity.STORE_STEP_GROUPS
EXPECTED = {  # file → (the patches it marks, the activities it scheduled)
    ROUNDS: (set(PATCHES), [STORE, STORE, Activity.TRAIN_STEP, *[STORE] * 5]),
    BEFORE: (
        {CARRY_PARTS_PATCH, SERIAL_PARTS_PATCH},
        [STORE, STORE, Activity.TRAIN_STEP, *[STORE] * 2],
    ),
    END: (
        {CARRY_PARTS_PATCH, SERIAL_PARTS_PATCH},
        [STORE, STORE, Activity.TRAIN_STEP, *[STORE] * 2, Activity.RECORD_LEDGER],
    ),
}
IDS = {ROUNDS: ROUNDS_ID, BEFORE: BEFORE_ID, END: END_ID}


def recorded(name: str) -> WorkflowHistory:
    return WorkflowHistory.from_json(
        IDS[name], json.loads(gzip.decompress((HISTORIES / name).read_bytes()))
    )


def commands(history: WorkflowHistory) -> tuple[set[str], list[str]]:
    """Which of `PATCHES` `history` marks, and the activities it scheduled."""
    markers = [
        e.SerializeToString()
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
    ]
    marked = {p for p in PATCHES if any(p.encode() in m for m in markers)}
    return marked, [name for name, _ in scheduled_inputs(list(history.events))]


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.asyncio
async def test_the_recorded_histories_replay(name: str) -> None:
    """This code's history marks the patch and made 2 more rounds; those before made one
    (test_replay.py replays them too, with the previous release's others)."""
    history = recorded(name)
    assert commands(history) == EXPECTED[name]
    await replay(history, LearnerWorkflow)


@pytest.mark.parametrize(("taken", "name"), [(True, ROUNDS), (False, BEFORE), (False, END)])
@pytest.mark.asyncio
async def test_a_replay_without_the_again_patch_check_fails(
    monkeypatch: pytest.MonkeyPatch, taken: bool, name: str
) -> None:
    """`workflow.patched(CARRY_AGAIN_PATCH)` answers without the history, on its `branch_only`
    copy (tests/workflows/replaying.py): the branch it took replays, the other fails. False
    (one round, the release before it) misses this code's 3 later stores; True (a second round
    whatever the history says, as the memoized `CARRY_PARTS_PATCH` did) schedules a store where
    the older histories continued as new or wrote their ledger."""
    await replays_on_its_branch_only(
        monkeypatch, recorded(name), CARRY_AGAIN_PATCH, taken, LearnerWorkflow
    )


@pytest.mark.slow  # a recorder: `make test` leaves it out, `make test-all` skips it
@pytest.mark.skipif(not os.environ.get("TEMPERED_RECORD_HISTORIES"), reason="records the history")
@pytest.mark.asyncio
async def test_record(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore, tmp_path: Path
) -> None:
    """test_learner_carry_burst.py's continue-as-new run; its first segment's history."""
    client = await connect(temporal_server.address, namespace)
    trainer = GroupsTrainer(store)
    gated = GatedStore(LearnerActivities(Settings(home=tmp_path), store), gated=3)
    handle = await start_with_groups(
        client, ROUNDS_ID, GROUPS[:FIRST], step=STEP, per_signal=2, max_steps=3, steps_per_run=1
    )
    first_run = handle.result_run_id
    assert first_run is not None
    async with workers(client, store, tmp_path, trainer, store_step_groups=gated.store_step_groups):
        await burst_while_carrying(client, handle.id, gated)
        await next_run(client, handle.id, first_run)
        await asyncio.wait_for(client.get_workflow_handle(handle.id).result(), WAIT_S)
    assert trainer.steps == {0: GROUPS[:4], 1: GROUPS[4:8], 2: GROUPS[8:12]}
    history = await client.get_workflow_handle(handle.id, run_id=first_run).fetch_history()
    assert commands(history) == EXPECTED[ROUNDS]
    data = WorkflowHistory(ROUNDS_ID, history.events).to_json().encode()
    (HISTORIES / ROUNDS).write_bytes(gzip.compress(data, mtime=0))
