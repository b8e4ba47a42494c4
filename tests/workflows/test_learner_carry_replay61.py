"""A learner's carry makes its second and later rounds behind a patch of their own
(`CARRY_AGAIN_PATCH`, workflows/learner_carry.py), or without its marker where the run may be
cc5559e's, and histories of the three releases replay where a marker tells them apart.

The carry's rounds were asked with `CARRY_PARTS_PATCH` alone, and `workflow.patched` answers a
patch once a run: a history recorded when the carry made one round (b0cf1ee: groups signalled
during its stores went inline, fine up to 2 MiB) made a second round where it holds its
continue-as-new, and failed to replay (TMPRL1100) on every retry of the workflow task: the
learner RUNNING for ever after a worker restart. Behind `CARRY_AGAIN_PATCH` alone, cc5559e's
histories (its loop, every round under `CARRY_PARTS_PATCH`) failed the other way: no marker,
no second round, where they hold its `store_step_groups`. Those histories:

- `learner_carry_one_round_end_before.json.gz` (b0cf1ee, ended at `max_steps`: a second round
  where it holds its `LEDGER_PATCH` marker and `record_ledger`), which lacks
  `CARRY_LAST_PATCH`'s marker: one round;
- `learner_carry_rounds_end_cc5559e.json.gz` (cc5559e, the same end, 5 groups signalled during
  the first round: 3 more parts), which holds it: every round;
- `learner_carry_rounds_cc5559e.json.gz` (cc5559e, continued as new, test_record's run) and
  `learner_carry_one_round_before.json.gz` (b0cf1ee, the same with 3 groups signalled) mark the
  same patches up to the carry: cc5559e's replays, b0cf1ee's is unsupported
  (`test_the_continued_one_round_history_is_unsupported`).

`learner_carry_rounds.json.gz` is this code's: test_learner_carry_burst.py's run, one step a
segment, whose first segment stores step 0's 2 parts, trains, stores the 3 groups left pending
in 2 parts while 5 more (~2.25 MB) are signalled, and stores those in 3 more parts (the patch's
marker). Recorded by `test_record` with `TEMPERED_RECORD_HISTORIES=1`; the cc5559e ones by its
body (`…_end_…`: test_learner_carry_burst.py's ending test's, `max_steps=1` and a `CarryParent`,
the ended run's history) in `git archive cc5559e`'s tree, under the workflow ids in `IDS`."""

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
from tests.workflows.replaying import (
    branch_only,
    patch_answers,
    replay,
    replay_failure,
    replays_on_its_branch_only,
)
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
from workflows.learner_carry import CARRY_AGAIN_PATCH, CARRY_LAST_PATCH, CARRY_PARTS_PATCH
from workflows.learner_request import SERIAL_PARTS_PATCH

HISTORIES = Path(__file__).parent / "histories"
ROUNDS, ROUNDS_ID = "learner_carry_rounds.json.gz", "carry-rounds"
BEFORE, BEFORE_ID = "learner_carry_one_round_before.json.gz", "r1-carry-old"
END, END_ID = "learner_carry_one_round_end_before.json.gz", "r1-carry-end-old"
LOOPED, LOOPED_ID = "learner_carry_rounds_cc5559e.json.gz", "carry-rounds-old"
LOOPED_END, LOOPED_END_ID = "learner_carry_rounds_end_cc5559e.json.gz", "carry-rounds-end-old"
PATCHES = (CARRY_PARTS_PATCH, CARRY_AGAIN_PATCH, SERIAL_PARTS_PATCH, CARRY_LAST_PATCH)
STORE, STEP_ACTIVITY, LEDGER = (
    Activity.STORE_STEP_GROUPS,
    Activity.TRAIN_STEP,
    Activity.RECORD_LEDGER,
)
EVERY = (CARRY_PARTS_PATCH, SERIAL_PARTS_PATCH)  # the patches each of them marks
EXPECTED = {  # file → (the patches it marks, the activities it scheduled)
    ROUNDS: ({*EVERY, CARRY_AGAIN_PATCH}, [STORE, STORE, STEP_ACTIVITY, *[STORE] * 5]),
    BEFORE: (set(EVERY), [STORE, STORE, STEP_ACTIVITY, *[STORE] * 2]),
    END: (set(EVERY), [STORE, STORE, STEP_ACTIVITY, *[STORE] * 2, LEDGER]),
    LOOPED: (set(EVERY), [STORE, STORE, STEP_ACTIVITY, *[STORE] * 5]),
    LOOPED_END: (
        {*EVERY, CARRY_LAST_PATCH},
        [STORE, STORE, STEP_ACTIVITY, LEDGER, *[STORE] * 5],
    ),
}
IDS = {
    ROUNDS: ROUNDS_ID,
    BEFORE: BEFORE_ID,
    END: END_ID,
    LOOPED: LOOPED_ID,
    LOOPED_END: LOOPED_END_ID,
}
SUPPORTED = sorted(set(EXPECTED) - {BEFORE})


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
def test_the_recorded_histories_hold_their_rounds(name: str) -> None:
    """This code's history marks the patch and made 2 more rounds, cc5559e's made them unmarked;
    b0cf1ee's made one."""
    assert commands(recorded(name)) == EXPECTED[name]


@pytest.mark.parametrize("name", SUPPORTED)
@pytest.mark.asyncio
async def test_the_recorded_histories_replay(name: str) -> None:
    """(test_replay.py replays the previous releases' too, with their others)."""
    await replay(recorded(name), LearnerWorkflow)


@pytest.mark.asyncio
async def test_the_continued_one_round_history_is_unsupported() -> None:
    """b0cf1ee's continue-as-new after one round: nothing it marks tells it from cc5559e's, whose
    second round this code makes (workflows/learner_carry.py): a store where it continued as new.
    Should a marker come to tell them apart, this fails: replay it with the others."""
    failure = await replay_failure(recorded(BEFORE), LearnerWorkflow)
    assert "TMPRL1100" in failure and "WorkflowExecutionContinuedAsNew" in failure, failure


@pytest.mark.asyncio
async def test_an_end_without_the_carry_last_marker_holds_the_again_patch_false_branch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`workflow.patched(CARRY_AGAIN_PATCH)` answers without the history, on its `branch_only`
    copy (tests/workflows/replaying.py): b0cf1ee's end (no `CARRY_LAST_PATCH` marker: one round
    unless the patch says otherwise) replays with False, and fails with True (a second round
    whatever the history says, as the memoized `CARRY_PARTS_PATCH` did), a store where it wrote
    its ledger."""
    await replays_on_its_branch_only(
        monkeypatch, recorded(END), CARRY_AGAIN_PATCH, False, LearnerWorkflow
    )


@pytest.mark.asyncio
async def test_a_continue_as_new_makes_later_rounds_unmarked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Continuing as new since `LEDGER_FIRST_PATCH`, the run may be cc5559e's: this code's history
    replays with `CARRY_AGAIN_PATCH` answering False too (its marker deprecated in the copy), its
    3 later stores made without it. Asked all the same, for the marker a run writes."""
    patch_answers(monkeypatch, CARRY_AGAIN_PATCH, False)
    copy = branch_only(recorded(ROUNDS), CARRY_AGAIN_PATCH)
    assert await replay_failure(copy, LearnerWorkflow) == ""


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
