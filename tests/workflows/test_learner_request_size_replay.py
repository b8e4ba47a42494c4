"""Recorded histories of a learner step whose groups pass `SIGNAL_BYTES` (`STEP_PARTS_PATCH` in
workflows/learner_request.py), replayed on this code:

- `learner_step_parts.json.gz`, recorded with the patch: its marker, a `store_step_groups` per
  part, then the `train_step` that names them;
- `learner_step_whole.json.gz`, the same step as the release before the patch ran it: no marker,
  one `train_step` of every group inline (recorded on this code with the patch check answering
  False, which is what that release's commands were; it fit a payload, at 1.35 MB).

A replay where either branch is gone fails (`test_a_replay_without_the_patch_check_fails`).
The step: 3 groups of ~450 KB (long, repetitive keys, so each file gzips to a few KB), in 2
parts. Recorded by `test_record` with `TEMPERED_RECORD_HISTORIES=1`."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory

from contracts.common import ObjectRef
from contracts.learner import TrajectoryGroup
from contracts.names import Activity
from infra.storage import ObjectStore
from tests.fixtures.temporal import TemporalServer
from tests.workflows.harness import connect
from tests.workflows.replaying import patch_answers, replay, replays_on_its_branch_only
from tests.workflows.test_learner_request_size import run_learner, scheduled_inputs
from workflows.learner import LearnerWorkflow
from workflows.learner_request import STEP_PARTS_PATCH

HISTORIES = Path(__file__).parent / "histories"
RECORDED = {  # file → (the id it ran under, whether the patch check answered True)
    "learner_step_parts.json.gz": ("learner-step-parts", True),
    "learner_step_whole.json.gz": ("learner-step-whole", False),
}


def group_of(index: int) -> TrajectoryGroup:
    """A group of ~450 KB as JSON: two fit `SIGNAL_BYTES`, three do not."""
    ref = ObjectRef(key="k" * 112_000, size=1, sha256="0" * 64)
    return TrajectoryGroup(
        task_id=f"t{index}", trajectories=[ref] * 4, rewards=[1.0, 0.0] * 2, policy_version=0
    )


def recorded(name: str) -> WorkflowHistory:
    return WorkflowHistory.from_json(
        RECORDED[name][0], json.loads(gzip.decompress((HISTORIES / name).read_bytes()))
    )


def commands(history: WorkflowHistory) -> tuple[bool, list[str]]:
    """Whether `history` has the patch's marker, and the activities it scheduled."""
    marker = any(
        STEP_PARTS_PATCH.encode() in e.SerializeToString()
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
    )
    return marker, [name for name, _ in scheduled_inputs(list(history.events))]


EXPECTED = {
    True: [
        Activity.STORE_STEP_GROUPS,
        Activity.STORE_STEP_GROUPS,
        Activity.TRAIN_STEP,
        Activity.RECORD_LEDGER,
    ],
    False: [Activity.TRAIN_STEP, Activity.RECORD_LEDGER],
}


@pytest.mark.parametrize("name", sorted(RECORDED))
@pytest.mark.asyncio
async def test_the_recorded_histories_replay(name: str) -> None:
    history = recorded(name)
    patched = RECORDED[name][1]
    assert commands(history) == (patched, EXPECTED[patched])
    await replay(history, LearnerWorkflow)


@pytest.mark.parametrize("name", sorted(RECORDED))
@pytest.mark.asyncio
async def test_a_replay_without_the_patch_check_fails(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """On its `branch_only` copy (tests/workflows/replaying.py), each history replays with the
    answer it took and fails with the other: a step's groups always by reference (True) or
    always inline (False: the release before)."""
    taken = RECORDED[name][1]
    await replays_on_its_branch_only(
        monkeypatch, recorded(name), STEP_PARTS_PATCH, taken, LearnerWorkflow
    )


@pytest.mark.slow  # a recorder: `make test` leaves it out, `make test-all` skips it
@pytest.mark.skipif(not os.environ.get("TEMPERED_RECORD_HISTORIES"), reason="records the histories")
@pytest.mark.parametrize("name", sorted(RECORDED))
@pytest.mark.asyncio
async def test_record(
    temporal_server: TemporalServer,
    namespace: str,
    store: ObjectStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
) -> None:
    workflow_id, patched = RECORDED[name]
    if not patched:  # the release before the patch: it asked nothing, and sent one request
        patch_answers(monkeypatch, STEP_PARTS_PATCH, False)
    groups = [group_of(i) for i in range(3)]
    client = await connect(temporal_server.address, namespace)
    final, trainer, history = await run_learner(client, store, tmp_path, workflow_id, groups)
    assert final.step == 1 and trainer.steps[0] == groups
    assert commands(history) == (patched, EXPECTED[patched])
    data = WorkflowHistory(workflow_id, history.events).to_json().encode()
    (HISTORIES / name).write_bytes(gzip.compress(data, mtime=0))
