"""Groups signalled while a learner's carry stores its pending groups are carried within a
payload too, on the dev server with the real `store_step_groups`, `load_step_groups` and ledger
activities on a real S3 (`train_step` a stand-in that reads its groups as the real one does).

`carry` (workflows/learner_carry.py) stores the pending groups it finds in parts, one workflow
task a part; `add_groups` signals delivered meanwhile stayed inline, their size never checked
again. Three signals of ~0.9 MB during the stores put ~2.25 MB in the continue-as-new input, or
in the `learner_done` and the result at the run's end: each refused (TMPRL1103) on every retry
of the workflow task, the learner RUNNING for ever. Now the carry repeats until what stays
inline is within `SIGNAL_BYTES`.

Each test: 4 groups a step, 7 of ~450 KB signalled first; step 0 takes 4, the 3 left (~1.35 MB)
are carried in 2 parts, and the first of those stores waits until 5 more (~2.25 MB) are
signalled."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from activities.learner import LearnerActivities
from activities.stored import read_model
from contracts.common import ObjectRef
from contracts.learner import StepGroups, TrajectoryGroup
from contracts.names import Activity, Queue
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.fixtures.temporal import TemporalServer
from tests.workflows.harness import connect
from tests.workflows.test_learner_carry_size import (
    WAIT_S,
    CarryParent,
    continued_input_bytes,
    ended,
    next_run,
    start_with_groups,
    workers,
)
from tests.workflows.test_learner_request_size import (
    GroupsTrainer,
    payload_bytes,
    scheduled_inputs,
)
from tests.workflows.test_learner_request_size_replay import group_of
from workflows.learner import LearnerWorkflow

STEP = 4
"""Groups a step: two of ~450 KB fit `SIGNAL_BYTES` (workflows/step_slots.py), three do not."""
FIRST = 7
"""Groups signalled before the learner first runs: step 0's 4, and 3 carried (2 parts)."""
BURST = 5
"""Groups signalled while the carry stores its first part (~2.25 MB, in 3 signals)."""
GROUPS = [group_of(i) for i in range(FIRST + BURST)]


class GatedStore:
    """The real `store_step_groups`, whose `gated`-th call waits for `gate` (`storing` set)."""

    def __init__(self, learner: LearnerActivities, gated: int) -> None:
        self.learner, self.gated, self.calls = learner, gated, 0
        self.gate, self.storing = asyncio.Event(), asyncio.Event()

    @activity.defn(name=Activity.STORE_STEP_GROUPS)
    async def store_step_groups(self, part: StepGroups) -> ObjectRef:
        self.calls += 1
        if self.calls == self.gated:
            self.storing.set()
            await self.gate.wait()
        return await self.learner.store_step_groups(part)


async def burst_while_carrying(client: Client, workflow_id: str, gated: GatedStore) -> None:
    """Once the carry stores its first part, signal `BURST` groups (2 a signal), then let it go."""
    await asyncio.wait_for(gated.storing.wait(), WAIT_S)
    handle = client.get_workflow_handle_for(LearnerWorkflow.run, workflow_id)
    for first in range(FIRST, FIRST + BURST, 2):
        await handle.signal(LearnerWorkflow.add_groups, GROUPS[first : first + 2])
    gated.gate.set()


def after_step(events: list[HistoryEvent]) -> list[str]:
    """The activities scheduled after the first `train_step`."""
    inputs = [name for name, _ in scheduled_inputs(events)]
    return inputs[inputs.index(Activity.TRAIN_STEP) + 1 :]


@pytest.mark.asyncio
async def test_groups_signalled_while_carrying_continue_as_new_by_reference(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore, tmp_path: Path
) -> None:
    """One step a segment: the 5 groups signalled during the carry go by reference too (3 more
    parts), and the next segments train on every group once, in order."""
    client = await connect(temporal_server.address, namespace)
    trainer = GroupsTrainer(store)
    learner = LearnerActivities(Settings(home=tmp_path), store)
    gated = GatedStore(learner, gated=3)  # step 0's 2 parts come first
    handle = await start_with_groups(
        client, "carry-burst", GROUPS[:FIRST], step=STEP, per_signal=2, max_steps=3,
        steps_per_run=1,
    )  # fmt: skip
    first_run = handle.result_run_id
    assert first_run is not None
    async with workers(client, store, tmp_path, trainer, store_step_groups=gated.store_step_groups):
        await burst_while_carrying(client, handle.id, gated)
        await next_run(client, handle.id, first_run)
        final = await asyncio.wait_for(
            client.get_workflow_handle_for(LearnerWorkflow.run, handle.id).result(), WAIT_S
        )
    assert (final.step, final.pending, final.pending_parts) == (3, [], [])
    assert trainer.steps == {0: GROUPS[:4], 1: GROUPS[4:8], 2: GROUPS[8:12]}
    history = await client.get_workflow_handle(handle.id, run_id=first_run).fetch_history()
    assert continued_input_bytes(history) < 64 * 1024
    # 3 groups in 2 parts, then the 5 signalled meanwhile in 3
    assert after_step(list(history.events)) == [Activity.STORE_STEP_GROUPS] * 5


@pytest.mark.asyncio
async def test_groups_signalled_while_carrying_at_the_end_go_by_reference(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore, tmp_path: Path
) -> None:
    """At `max_steps`: the `learner_done` and the result name all 8 groups left over by
    reference, in order, and each is within a payload."""
    client = await connect(temporal_server.address, namespace)
    trainer = GroupsTrainer(store)
    learner = LearnerActivities(Settings(home=tmp_path), store)
    gated = GatedStore(learner, gated=3)
    parent = await client.start_workflow(
        CarryParent.run, id="carry-burst-parent", task_queue=Queue.AGENT_TASKS.value
    )
    handle = await start_with_groups(
        client, "carry-burst-end", GROUPS[:FIRST], step=STEP, per_signal=2, max_steps=1,
        parent_workflow_id=parent.id,
    )  # fmt: skip
    async with workers(client, store, tmp_path, trainer, store_step_groups=gated.store_step_groups):
        await burst_while_carrying(client, handle.id, gated)
        await ended(client, handle)
        final = await handle.result()
        done = await asyncio.wait_for(parent.result(), WAIT_S)
    assert done.final is not None and done.final.model_dump() == final.model_dump()
    assert (final.step, final.pending) == (1, [])
    assert payload_bytes(final) < 64 * 1024
    left: list[TrajectoryGroup] = [
        g
        for ref in final.pending_parts
        for g in read_model(store, "pending_parts", ref, StepGroups).groups
    ]
    assert left == GROUPS[STEP:]
    assert len(final.pending_parts) == 5  # 3 groups in 2 parts, then 5 in 3
