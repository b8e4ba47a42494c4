"""write_trajectories against a real SeaweedFS: assembled once, retries are byte-identical no-ops."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.rewards import RewardActivities
from contracts.rollout import CompletionRecord, SampleState, TurnRecord, WriteTrajectoriesRequest
from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import TaskSpec
from contracts.trajectory import Trajectory
from infra import keys
from infra.storage import ObjectStore

RUN = "run-rw"
TASK = TaskSpec(
    id="add", prompt="Write add(a, b).", entry_point="add", tests="assert add(1, 2) == 3"
)


def stored_turn(store: ObjectStore, sample: int, turn: int, passed: bool) -> TurnRecord:
    """Write one turn's artefacts the way generate/execute do, and return its record."""
    code = "def add(a, b):\n    return a + b\n" if passed else "def add(a, b):\n    return a - b\n"
    completion = CompletionRecord(
        text=f"```python\n{code}```",
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=[10 + sample, 20 + turn],
        logprobs=[-0.5, -1.25],
        policy_version=turn,
        started_at=f"2025-01-01T00:0{turn}:00Z",
        finished_at=f"2025-01-01T00:0{turn}:0{sample}Z",
    )
    status = ExecStatus.PASSED if passed else ExecStatus.FAILED
    result = ExecutionResult(status=status, tests_passed=int(passed), tests_total=1)

    def key(name: str) -> str:
        return keys.turn_key(RUN, TASK.id, sample, turn, name)

    return TurnRecord(
        turn=turn,
        policy_version=turn,
        completion=store.put_json(key("completion.json"), completion, create_only=True),
        code=store.put_text(key("code.py"), code, create_only=True),
        status=status,
        tests_passed=int(passed),
        tests_total=1,
        result=store.put_json(key("result.json"), result, create_only=True),
        reward=1.0 if passed else -0.1,
    )


def request(store: ObjectStore, group_size: int = 3) -> WriteTrajectoriesRequest:
    samples = []
    for s in range(group_size):
        solved = s != 0  # sample 0 fails both turns; the others solve on turn 1
        turns = [stored_turn(store, s, 0, False), stored_turn(store, s, 1, solved)]
        samples.append(
            SampleState(sample=s, turns=turns, solved=solved, reward=0.9 if solved else -0.2)
        )
    return WriteTrajectoriesRequest(run_id=RUN, task=TASK, group_size=group_size, samples=samples)


@pytest.mark.asyncio
async def test_writes_each_trajectory_once(store: ObjectStore) -> None:
    activities = RewardActivities(store)
    env = ActivityEnvironment()
    req = request(store)

    first = await env.run(activities.write_trajectories, req)
    assert first.created == 3
    assert [ref.key for ref in first.trajectories] == [
        keys.trajectory_key(RUN, TASK.id, s) for s in range(3)
    ]
    stored = [store.get_bytes(ref.key) for ref in first.trajectories]

    retry = await env.run(activities.write_trajectories, req)
    assert retry.created == 0
    assert retry.trajectories == first.trajectories
    assert [store.get_bytes(ref.key) for ref in retry.trajectories] == stored

    trajectory = store.get_model(first.trajectories[1].key, Trajectory)
    assert trajectory.id == f"{RUN}.{TASK.id}.s1"
    assert trajectory.solved and trajectory.reward == 0.9
    assert [t.status for t in trajectory.turns] == [ExecStatus.FAILED, ExecStatus.PASSED]
    assert trajectory.turns[1].completion_token_ids == [11, 21]
    assert trajectory.turns[1].code.endswith("return a + b\n")
    assert trajectory.turns[0].reward == -0.1
    assert trajectory.created_at == "2025-01-01T00:01:01Z"  # last completion, not the clock


@pytest.mark.asyncio
async def test_rejects_tampered_artefact(store: ObjectStore) -> None:
    req = request(store, group_size=1)
    code_ref = req.samples[0].turns[0].code
    store.put_text(code_ref.key, "import os  # swapped after the fact\n")
    with pytest.raises(ApplicationError, match=r"samples\[0\]\.turns\[0\]\.code") as err:
        await ActivityEnvironment().run(RewardActivities(store).write_trajectories, req)
    assert err.value.non_retryable


@pytest.mark.asyncio
async def test_infra_error_turn_never_becomes_a_trajectory(store: ObjectStore) -> None:
    req = request(store, group_size=1)
    req.samples[0].turns[1].result = None
    req.samples[0].turns[1].status = ExecStatus.INFRA_ERROR
    with pytest.raises(ApplicationError, match="never a reward") as err:
        await ActivityEnvironment().run(RewardActivities(store).write_trajectories, req)
    assert err.value.non_retryable
    assert not store.exists(keys.trajectory_key(RUN, TASK.id, 0))


@pytest.mark.asyncio
async def test_different_trajectory_under_same_key_is_refused(store: ObjectStore) -> None:
    req = request(store, group_size=1)
    await ActivityEnvironment().run(RewardActivities(store).write_trajectories, req)
    req.samples[0].reward = 0.5
    with pytest.raises(ApplicationError, match="already holds different content") as err:
        await ActivityEnvironment().run(RewardActivities(store).write_trajectories, req)
    assert err.value.non_retryable
