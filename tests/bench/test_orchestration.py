"""bench/orchestration.py's plain side: PlainRollout sends the requests AgentTaskWorkflow sends
(workflows/requests.py builds both), so the two sides of the bench do the same work.

The workers' activities are stand-ins that record what they get: every sample's program passes
its tests at the first turn."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from contracts.common import ObjectRef
from contracts.names import Queue
from contracts.rollout import (
    Completion,
    GenerateRequest,
    GenerateResponse,
    WriteTrajectoriesRequest,
    WriteTrajectoriesResponse,
)
from contracts.sandbox import (
    ExecStatus,
    ExecuteOutcome,
    ExecuteRequest,
    ExecuteResponse,
)
from contracts.task import AgentTaskInput, TaskSpec
from workflows.episodes import EpisodeGroup


def ref(name: str) -> ObjectRef:
    return ObjectRef(key=name, size=1, sha256="0" * 64)


def test_the_plain_rollout_sends_the_workflows_requests() -> None:
    from orchestration import PlainRollout

    sent: list[Any] = []

    async def generate(request: GenerateRequest) -> GenerateResponse:
        sent.append(request)
        return GenerateResponse(
            policy_version=0,
            completions=[
                Completion(sample=i.sample, completion=ref(f"c{i.sample}"), code=ref("code"))
                for i in request.items
            ],
        )

    async def execute(request: ExecuteRequest) -> ExecuteResponse:
        sent.append(request)
        return ExecuteResponse(
            outcomes=[
                ExecuteOutcome(sample=i.sample, status=ExecStatus.PASSED, result=ref("r"))
                for i in request.items
            ]
        )

    async def write_trajectories(request: WriteTrajectoriesRequest) -> WriteTrajectoriesResponse:
        sent.append(request)
        return WriteTrajectoriesResponse(trajectories=[], created=0)

    plans = {
        Queue.INFERENCE: SimpleNamespace(activities=[generate]),
        Queue.SANDBOX: SimpleNamespace(activities=[execute]),
        Queue.REWARDS: SimpleNamespace(activities=[write_trajectories]),
    }
    task = TaskSpec(
        id="add", prompt="Write add.", entry_point="add", tests="assert add(1, 2) == 3",
        helpers="def twice(x):\n    return 2 * x\n", hidden_tests="assert add(0, 0) == 0",
    )  # fmt: skip
    job = AgentTaskInput(task=task, run_id="bench-plain", group_size=2, max_turns=3)

    turns = asyncio.run(PlainRollout(plans)(job))

    assert turns == 1 and [type(r) for r in sent] == [
        GenerateRequest,
        ExecuteRequest,
        WriteTrajectoriesRequest,
    ]
    generated, executed, written = sent
    assert generated.max_turns == 3  # the model is told its turns, as the workflow tells it
    assert executed.helpers == task.helpers  # the checker runs the task's helpers
    from workflows.requests import execute_request, generate_request, write_trajectories_request

    fresh = EpisodeGroup(job)
    assert generated == generate_request(job, 0, fresh.acting())
    completions = asyncio.run(generate(generated)).completions
    assert executed == execute_request(job, 0, completions)
    assert written.samples and all(e.solved for e in written.samples)
    assert written == write_trajectories_request(job, written.samples)
