"""The `learner_progress` a step signals says what it trained, on the dev server with the real
ledger activities on a real S3 (`train_step` a stand-in that answers as the real one does for a
step sent one flat group and one with a signal): `trained_groups` counts the groups sent (the
name kept for runs of earlier builds, which require it), and the trajectories trained and
skipped are said beside it."""

from __future__ import annotations

import asyncio

import pytest
from temporalio import activity, workflow
from temporalio.worker import Worker

from activities.ledger import LedgerActivities
from contracts.common import ObjectRef
from contracts.learner import (
    GRPOConfig,
    LearnerDone,
    LearnerInput,
    LearnerProgress,
    PolicyVersion,
    TrainStepRequest,
    TrainStepResponse,
    TrajectoryGroup,
)
from contracts.names import Activity, Queue, Signal
from infra.storage import ObjectStore
from tests.fixtures.temporal import TemporalServer
from tests.workflows.harness import connect
from workflows.learner import LearnerWorkflow

DIGEST = "0" * 64


def group(task: str, rewards: list[float]) -> TrajectoryGroup:
    refs = [ObjectRef(key=f"t/{task}/{i}", size=1, sha256=DIGEST) for i in range(len(rewards))]
    return TrajectoryGroup(task_id=task, trajectories=refs, rewards=rewards, policy_version=0)


@activity.defn(name=Activity.TRAIN_STEP.value)
async def train_step(request: TrainStepRequest) -> TrainStepResponse:
    """The real step's answer for a flat group (its 4 skipped: no gradient) and one trained."""
    version = request.step + 1
    return TrainStepResponse(
        policy=PolicyVersion(run_id=request.run_id, version=version, prefix=f"p/{version}"),
        loss=0.1,
        trained=4,
        skipped=4,
        reward_mean=0.25,
        duration_s=2.0,
        ack=ObjectRef(key=f"ack/{request.step}", size=1, sha256=DIGEST),
    )


@workflow.defn(name="Fix60ProgressParent", sandboxed=False)
class ProgressParent:
    """The learner's parent as the run is to it: keeps each `learner_progress`, ends at
    `learner_done` with them."""

    def __init__(self) -> None:
        self.progress: list[LearnerProgress] = []
        self.done = False

    @workflow.run
    async def run(self) -> list[LearnerProgress]:
        await workflow.wait_condition(lambda: self.done)
        return self.progress

    @workflow.signal(name=Signal.LEARNER_DONE)
    def learner_done(self, done: LearnerDone) -> None:
        self.done = True

    @workflow.signal(name=Signal.LEARNER_PROGRESS)
    def learner_progress(self, progress: LearnerProgress) -> None:
        self.progress.append(progress)


@pytest.mark.asyncio
async def test_the_progress_of_a_step_says_what_it_trained(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore
) -> None:
    client = await connect(temporal_server.address, namespace)
    ledger = LedgerActivities(store)
    async with (
        Worker(
            client, task_queue=Queue.AGENT_TASKS.value, workflows=[LearnerWorkflow, ProgressParent]
        ),
        Worker(client, task_queue=Queue.LEARNER.value, activities=[train_step]),
        Worker(
            client,
            task_queue=Queue.REWARDS.value,
            activities=[ledger.record_ledger, ledger.find_consumed],
        ),
    ):
        parent = await client.start_workflow(
            ProgressParent.run, id="fix60-progress-parent", task_queue=Queue.AGENT_TASKS.value
        )
        learner = await client.start_workflow(
            LearnerWorkflow.run,
            LearnerInput(
                run_id="fix60-progress",
                config=GRPOConfig(groups_per_step=2),
                max_steps=1,
                parent_workflow_id=parent.id,
            ),
            id="fix60-progress-learner",
            task_queue=Queue.AGENT_TASKS.value,
        )
        groups = [group("flat", [0.0] * 4), group("mixed", [0.0, 1.0, 0.0, 1.0])]
        await learner.signal(LearnerWorkflow.add_groups, groups)
        progress = await asyncio.wait_for(parent.result(), 60)
    [step] = progress
    assert (step.step, step.policy_version, step.reward_mean, step.loss) == (1, 1, 0.25, 0.1)
    assert step.trained_groups == 2  # sent: the flat one was not trained
    assert (step.trained, step.skipped, step.dropped_stale) == (4, 4, 0)
