"""A learner step whose groups pass Temporal's 2 MiB payload limit is scheduled and trains, on
the dev server with the real `store_step_groups` and ledger activities on a real S3
(`train_step` a stand-in that reads its groups as the real one does).

Realistic groups (G = 256 trajectories, keys as `keys.trajectory_key` spells them) measure ~45 KB
each as JSON through the project's data converter: one `TrainStepRequest` carrying them passed
2 MiB at ~47 groups, and the workflow task that scheduled it failed on every retry (the learner
RUNNING for ever, no step taken). Now (`STEP_PARTS_PATCH`) they are stored in parts of
`SIGNAL_BYTES` at most and the request names the parts."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from activities.learner import LearnerActivities
from activities.learner_groups import with_groups
from activities.ledger import LedgerActivities
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
from infra import keys
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.fixtures.temporal import TemporalServer
from tests.workflows.harness import connect
from workflows.budget import PAYLOAD_LIMIT
from workflows.learner import LearnerWorkflow
from workflows.step_slots import SIGNAL_BYTES

RUN = "run-2024-06-01-coder"
SAMPLES = 256
GROUPS = 50
"""Groups of one step: ~2.25 MB as one request, past `PAYLOAD_LIMIT`."""
PER_SIGNAL = 20
"""Groups per `add_groups` signal (~0.9 MB: each within the run's `SIGNAL_BYTES`)."""


def large_group(index: int) -> TrajectoryGroup:
    task = f"swe-task-{index:05d}"
    refs = [
        ObjectRef(
            key=keys.trajectory_key(RUN, task, sample),
            size=120_000 + sample,
            sha256=hashlib.sha256(f"{task}/{sample}".encode()).hexdigest(),
        )
        for sample in range(SAMPLES)
    ]
    rewards = [0.25 * (sample % 5) for sample in range(SAMPLES)]
    return TrajectoryGroup(task_id=task, trajectories=refs, rewards=rewards, policy_version=0)


def payload_bytes(value: object) -> int:
    (payload,) = pydantic_data_converter.payload_converter.to_payloads([value])
    return payload.ByteSize()


class GroupsTrainer:
    """`train_step`: publishes version step + 1 at once and remembers each step's groups, read
    as the real step reads them (`with_groups`)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self.steps: dict[int, list[TrajectoryGroup]] = {}

    @activity.defn(name=Activity.TRAIN_STEP.value)
    async def train_step(self, request: TrainStepRequest) -> TrainStepResponse:
        self.steps[request.step] = with_groups(self.store, request).groups
        version = request.step + 1
        return TrainStepResponse(
            policy=PolicyVersion(run_id=request.run_id, version=version, prefix=f"p/{version}"),
            loss=0.0,
            trained=sum(len(g.trajectories) for g in self.steps[request.step]),
            ack=ObjectRef(key=f"ack/{request.step}", size=1, sha256="0" * 64),
        )


def test_realistic_groups_pass_a_payload_at_the_measured_count() -> None:
    """The measurement the bound rests on: ~45 KB a group at G = 256; 50 pass 2 MiB."""
    one = payload_bytes(large_group(0))
    assert 40_000 < one < 50_000, one
    request = TrainStepRequest(
        run_id=RUN, step=0, groups=[large_group(i) for i in range(GROUPS)], config=GRPOConfig()
    )
    assert payload_bytes(request) > PAYLOAD_LIMIT


async def run_learner(
    client: Client, store: ObjectStore, home: Path, workflow_id: str, groups: list[TrajectoryGroup]
) -> tuple[LearnerInput, GroupsTrainer, WorkflowHistory]:
    """One learner step of `groups`, signalled `PER_SIGNAL` at a time (or one each, if larger
    than `SIGNAL_BYTES` / `PER_SIGNAL`): its result, trainer and history."""
    per_signal = PER_SIGNAL if len(groups[0].model_dump_json()) * PER_SIGNAL < SIGNAL_BYTES else 1
    trainer, ledger = GroupsTrainer(store), LedgerActivities(store)
    learner = LearnerActivities(Settings(home=home), store)  # its `store_step_groups`
    async with (
        Worker(client, task_queue=Queue.AGENT_TASKS.value, workflows=[LearnerWorkflow]),
        Worker(
            client,
            task_queue=Queue.LEARNER.value,
            activities=[trainer.train_step, learner.store_step_groups],
        ),
        Worker(
            client,
            task_queue=Queue.REWARDS.value,
            activities=[ledger.record_ledger, ledger.find_consumed],
        ),
    ):
        handle = await client.start_workflow(
            LearnerWorkflow.run,
            LearnerInput(
                run_id=RUN,
                config=GRPOConfig(groups_per_step=len(groups)),
                max_steps=1,
                burst=per_signal,
            ),
            id=workflow_id,
            task_queue=Queue.AGENT_TASKS.value,
        )
        for first in range(0, len(groups), per_signal):
            await handle.signal(LearnerWorkflow.add_groups, groups[first : first + per_signal])
        final: LearnerInput = await asyncio.wait_for(handle.result(), 60)  # before: for ever
        history = await handle.fetch_history()
    return final, trainer, history


@pytest.mark.asyncio
async def test_a_step_of_groups_past_a_payload_trains(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore, tmp_path: Path
) -> None:
    groups = [large_group(i) for i in range(GROUPS)]
    client = await connect(temporal_server.address, namespace)
    final, trainer, history = await run_learner(client, store, tmp_path, "learner-large", groups)
    assert final.step == 1 and final.pending == []
    assert trainer.steps[0] == groups  # every group, whole, in order, once
    inputs = scheduled_inputs(list(history.events))
    parts = [size for name, size in inputs if name == Activity.STORE_STEP_GROUPS]
    assert len(parts) == 3, inputs  # 2.25 MB in parts of 1 MiB at most
    assert max(parts) <= SIGNAL_BYTES + 4096, inputs
    ((_, request_bytes),) = [i for i in inputs if i[0] == Activity.TRAIN_STEP]
    assert request_bytes < 4096, inputs  # the request names the parts


def scheduled_inputs(events: list[HistoryEvent]) -> list[tuple[str, int]]:
    """Each activity the learner scheduled: (its type, its input's bytes)."""
    scheduled = []
    for event in events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            attributes = event.activity_task_scheduled_event_attributes
            scheduled.append((attributes.activity_type.name, attributes.input.ByteSize()))
    return scheduled
