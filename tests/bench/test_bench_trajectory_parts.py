"""The benches' plain loops write a group's trajectories as AgentTaskWorkflow does: in parts of
whole episodes within a payload each (`workflows.requests.write_trajectories_parts`, the one
home of that rule), one after the other, every episode once.

bench/orchestration.py's `PlainRollout` runs on recording stand-ins of its workers (as
tests/bench/test_orchestration.py does), with long object keys so a few steps pass the bound;
bench/episodes_agent.py's `PlainTask` on tests/workflows/harness.py's scripted sandbox and the
bench's scripted model, the real trajectory writer and real S3, each sample writing a 1 KB
file every step (as tests/workflows/test_agent_task_parts.py's workflow does).

Before, both sent one `write_trajectories` request for the whole group: past `EPISODES_BYTES`
the workflow sends several, so the two sides of each bench no longer made the same calls."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace

import pytest

from activities.rewards import RewardActivities
from contracts.common import ObjectRef
from contracts.episode import ToolCall
from contracts.names import Activity, Queue
from contracts.rollout import (
    Completion,
    EpisodeState,
    GenerateRequest,
    GenerateResponse,
    WriteTrajectoriesRequest,
    WriteTrajectoriesResponse,
)
from contracts.sandbox import ExecStatus, ExecuteOutcome, ExecuteRequest, ExecuteResponse
from contracts.task import AgentTaskInput, TaskSpec
from infra import keys
from infra.storage import ObjectStore
from tests.bench.test_episodes_agent import Call, recorded, task_input
from tests.workflows.harness import ScriptedSandbox
from workflows.requests import EPISODES_BYTES, json_bytes, write_trajectories_parts

KEY_CHARS = 2000
"""An object key's length in the stand-ins' refs: about 6 KB a `code` step (three refs)."""


def long_ref(name: str) -> ObjectRef:
    return ObjectRef(key=(name + "/" + "k" * KEY_CHARS), size=1, sha256="0" * 64)


def check_parts(job: AgentTaskInput, written: list[WriteTrajectoriesRequest], group: int) -> None:
    """Several requests, each within a payload, every sample once in order: the very requests
    `write_trajectories_parts` builds from the group's final episodes."""
    assert len(written) > 1, f"one request of {json_bytes(written[0])} bytes"
    assert all(json_bytes(r) <= EPISODES_BYTES for r in written)
    episodes: list[EpisodeState] = [e for r in written for e in r.samples]
    assert [e.sample for e in episodes] == list(range(group))
    assert written == write_trajectories_parts(job, episodes)


def test_the_orchestration_plain_rollout_writes_in_parts() -> None:
    from orchestration import PlainRollout

    written: list[WriteTrajectoriesRequest] = []

    async def generate(request: GenerateRequest) -> GenerateResponse:
        return GenerateResponse(
            policy_version=0,
            completions=[
                Completion(
                    sample=i.sample,
                    completion=long_ref(f"c{i.sample}-{request.turn}"),
                    code=long_ref("code"),
                )
                for i in request.items
            ],
        )

    async def execute(request: ExecuteRequest) -> ExecuteResponse:
        return ExecuteResponse(
            outcomes=[
                ExecuteOutcome(sample=i.sample, status=ExecStatus.FAILED, result=long_ref("r"))
                for i in request.items
            ]
        )

    async def write_trajectories(request: WriteTrajectoriesRequest) -> WriteTrajectoriesResponse:
        written.append(request)
        return WriteTrajectoriesResponse(trajectories=[], created=0)

    plans = {
        Queue.INFERENCE: SimpleNamespace(activities=[generate]),
        Queue.SANDBOX: SimpleNamespace(activities=[execute]),
        Queue.REWARDS: SimpleNamespace(activities=[write_trajectories]),
    }
    task = TaskSpec(id="add", prompt="Write add.", entry_point="add", tests="assert add(1, 2) == 3")
    job = AgentTaskInput(task=task, run_id="bench-parts", group_size=16, max_turns=8)

    turns = asyncio.run(PlainRollout(plans)(job))

    assert turns == 8
    check_parts(job, written, 16)
    assert all(len(e.steps) == 8 for r in written for e in r.samples)


def writes(sample: int, step: int) -> ToolCall:
    line = f"# sample {sample} step {step}: a line of a realistic source file\n"
    content = (line * (1024 // len(line) + 1))[:1024]
    return ToolCall(
        name="write_file", arguments={"path": f"src/m{step % 3}.py", "content": content}
    )


@pytest.mark.asyncio
async def test_the_episodes_agent_plain_task_writes_in_parts(store: ObjectStore) -> None:
    from episodes_agent import PlainTask, ScriptedPolicy, activity_methods

    group, steps = 32, 20  # 640 episode-steps of ~890 bytes: past `EPISODES_BYTES` (~500 KB)
    job = task_input(
        store,
        f"bench-parts-{uuid.uuid4().hex[:6]}",
        group_size=group,
        max_turns=steps,
        max_context_tokens=1 << 16,
    )
    policy = ScriptedPolicy(store, {job.task.id: writes})
    calls: list[Call] = []
    methods = activity_methods(
        ScriptedSandbox(store, "a"), policy.generate, RewardActivities(store).write_trajectories
    )
    result = await PlainTask(recorded(methods, calls))(job)

    assert result.turns == steps and result.state == "DONE"
    names = [name for name, _ in calls]
    write_calls = names.count(Activity.WRITE_TRAJECTORIES.value)
    assert names[-write_calls:] == [Activity.WRITE_TRAJECTORIES.value] * write_calls  # the end
    written = [
        WriteTrajectoriesRequest.model_validate(request)
        for name, request in calls
        if name == Activity.WRITE_TRAJECTORIES.value
    ]
    check_parts(job, written, group)
    assert [r.key for r in result.trajectories] == [
        keys.trajectory_key(job.run_id, job.task.id, s) for s in range(group)
    ]
    stored = sorted(store.list_keys(keys.trajectories_prefix(job.run_id)))
    assert stored == sorted(r.key for r in result.trajectories)
