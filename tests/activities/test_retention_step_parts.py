"""The live prune (`prune_policies`, on a real SeaweedFS) deletes the stored parts of a learner's
groups (`keys.learner_step_groups_key`) of each step below the newest acknowledged one, and
keeps those of the newest acknowledged step (`train_step` reads a step's parts before it looks
for its ack: a retried attempt of that step would fail, without retry, on a part deleted) and of
the steps above it (the step being stored, a segment's carried groups). The real `train_step`,
retried after a prune, still answers its recorded step. A finished run's prune:
tests/infra/test_retention_step_parts.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.learner import LearnerActivities
from activities.retention import RetentionActivities
from contracts.common import ObjectRef
from contracts.learner import StepGroups, TrainStepRequest, TrainStepResponse
from contracts.run import PrepareRunRequest, PrunePoliciesRequest
from infra import keys
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.activities.test_learner import CONFIG, write_group
from tests.infra.test_retention_step_parts import parts_of, store_part

RUN = "parts-pruned"


async def prune(store: ObjectStore, below: int, since: int | None = None) -> None:
    request = PrunePoliciesRequest(run_id=RUN, below=below, since=since)
    await ActivityEnvironment().run(RetentionActivities(store).prune_policies, request)


@pytest.mark.asyncio
async def test_a_live_prune_deletes_the_parts_of_the_steps_below_the_newest_ack(
    store: ObjectStore,
) -> None:
    """Steps 0 and 1 acknowledged, step 2's groups stored and a segment's pending groups carried
    at step 2: step 0's parts go, step 1's and step 2's stay; another run's stay."""
    for step, task in [(0, "a"), (0, "b"), (1, "c"), (2, "d"), (2, "carried")]:
        store_part(store, RUN, step, task)
    store_part(store, "other-run", 0, "x")
    store.put_text(keys.learner_ack_key(RUN, 0), "{}")
    await prune(store, below=1)
    assert parts_of(store, RUN) == {0: 2, 1: 1, 2: 2}  # step 0 may be retried yet
    store.put_text(keys.learner_ack_key(RUN, 1), "{}")
    await prune(store, below=2, since=1)
    assert parts_of(store, RUN) == {1: 1, 2: 2}
    assert parts_of(store, "other-run") == {0: 1}
    assert store.exists(keys.learner_ack_key(RUN, 0))


@pytest.mark.asyncio
async def test_a_step_retried_after_a_prune_answers_its_recorded_step(
    store: ObjectStore, tmp_path: Path
) -> None:
    """The real `train_step` on parts, then the run's prune, then the step again (an attempt
    whose result was lost): it reads its parts first, and answers the ack it wrote."""
    acts, env = LearnerActivities(Settings(home=tmp_path / "home"), store), ActivityEnvironment()
    await env.run(acts.prepare_run, PrepareRunRequest(run_id=RUN, base_model="tiny"))

    async def trained(step: int, tasks: list[str]) -> tuple[TrainStepRequest, TrainStepResponse]:
        refs: list[ObjectRef] = []
        for seed, task in enumerate(tasks):
            part = StepGroups(
                run_id=RUN, step=step, groups=[write_group(store, task, step, seed, run=RUN)]
            )
            refs.append(await env.run(acts.store_step_groups, part))
        request = TrainStepRequest(
            run_id=RUN, step=step, groups=[], group_parts=refs, config=CONFIG
        )
        return request, await env.run(acts.train_step, request)

    request0, first0 = await trained(0, ["t1", "t2"])
    await prune(store, below=1)
    assert await env.run(acts.train_step, request0) == first0
    request1, first1 = await trained(1, ["t3", "t4"])
    carried = StepGroups(run_id=RUN, step=2, groups=[write_group(store, "t5", 2, 5, run=RUN)])
    carry = await env.run(acts.store_step_groups, carried)  # the segment continues as new
    await prune(store, below=2, since=1)  # the run's, once version 2 is out (keep_versions 1)

    assert parts_of(store, RUN) == {1: 2, 2: 1}
    assert await env.run(acts.train_step, request1) == first1
    assert await env.run(acts.load_step_groups, carry) == carried  # the next segment reads it
