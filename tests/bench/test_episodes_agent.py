"""bench/episodes_agent.py: its plain loop makes the very activity calls AgentTaskWorkflow makes,
run as a training run's child (bench/task_parent.py), in the same order with the same requests.

Both sides run against the same scripted stand-ins (tests/workflows/harness.py's sandbox, the
bench's scripted model, the real write_trajectories) on the real dev server and S3; each side's
calls are recorded where they reach the activities (a worker interceptor on the Temporal side).
Episodes end every way a bench episode could: submitted, a call-less answer, the step budget,
the context budget with no completion left to step."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from temporalio import activity
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from activities.rewards import RewardActivities
from contracts.episode import ToolCall
from contracts.names import Activity, Queue
from contracts.task import AgentTaskInput, SamplingParams
from infra.storage import ObjectStore
from tests.workflows.harness import ScriptedSandbox, connect, running_workers, tree_digest
from workflows.agent_task import AgentTaskWorkflow

Call = tuple[str, dict[str, Any]]


class Recorder(Interceptor):
    """Records every activity a worker runs: (activity type, its request as JSON)."""

    def __init__(self, calls: list[Call]) -> None:
        self.calls = calls

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        calls = self.calls

        class Record(ActivityInboundInterceptor):
            async def execute_activity(self, input: ExecuteActivityInput) -> Any:
                calls.append((activity.info().activity_type, input.args[0].model_dump(mode="json")))
                return await super().execute_activity(input)

        return Record(next)


def recorded(
    methods: dict[Activity, Callable[[Any], Awaitable[Any]]], calls: list[Call]
) -> dict[Activity, Callable[[Any], Awaitable[Any]]]:
    def one(name: Activity, method: Callable[[Any], Awaitable[Any]]) -> Any:
        async def call(request: Any) -> Any:
            calls.append((name.value, request.model_dump(mode="json")))
            return await method(request)

        return call

    return {name: one(name, method) for name, method in methods.items()}


def solver(sample: int, step: int) -> str | ToolCall:
    """Sample 0 fixes and submits; sample 1 reads, answers without a call, submits; sample 2
    runs a command until the step budget (or the context budget) ends it."""
    plans: dict[int, list[str | ToolCall]] = {
        0: [ToolCall(name="write_file", arguments={"path": "fixed.py", "content": "ok"}),
            ToolCall(name="submit")],
        1: [ToolCall(name="read_file", arguments={"path": "fixed.py"}), "I am done.",
            ToolCall(name="submit")],
    }  # fmt: skip
    plan = plans.get(sample, [])
    return plan[step] if step < len(plan) else ToolCall(name="bash", arguments={"command": "ls"})


def task_input(store: ObjectStore, run_id: str, **fields: Any) -> AgentTaskInput:
    from contracts.task import EnvName, TaskSpec, WorkspaceSpec

    files = store.put_json(
        f"scripted-snapshots/{tree_digest({'fixed.py': 'no'})}.json", {"fixed.py": "no"}
    )
    task = TaskSpec(
        id="fix",
        prompt="Make fixed.py read ok, then submit.",
        env=EnvName.WORKSPACE,
        workspace=WorkspaceSpec(files=files, verifier=store.put_text("scripted-tests", "t")),
    )
    values: dict[str, Any] = {"task": task, "run_id": run_id, "group_size": 3, **fields}
    return AgentTaskInput.model_validate(values)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "budget",
    [
        {"max_turns": 4, "sampling": SamplingParams(max_new_tokens=4)},  # sample 2: step budget
        {  # sample 2's fourth prompt (15 tokens) does not fit 64 - 50: no completion to step
            "max_turns": 6,
            "max_context_tokens": 64,
            "sampling": SamplingParams(max_new_tokens=50),
        },
    ],
    ids=["step-budget", "context-budget"],
)
async def test_the_plain_loop_makes_the_workflows_calls_in_its_order(
    temporal_server: Any, namespace: str, store: ObjectStore, budget: dict[str, Any]
) -> None:
    from episodes_agent import PlainTask, ScriptedPolicy, activity_methods
    from task_parent import PARENT_QUEUE, TaskParent, run_as_children

    client = await connect(temporal_server.address, namespace)
    job = task_input(store, f"bench-{uuid.uuid4().hex[:6]}", **budget)
    policy = ScriptedPolicy(store, {job.task.id: solver})
    rewards = RewardActivities(store)
    through_temporal: list[Call] = []
    sandbox = ScriptedSandbox(store, "a")
    hooks = {"interceptors": [Recorder(through_temporal)]}
    by_queue: dict[Queue | str, dict[str, Any]] = {
        Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]},
        PARENT_QUEUE: {"workflows": [TaskParent]},
        Queue.INFERENCE: {"activities": [policy.generate], **hooks},
        Queue.REWARDS: {"activities": [rewards.write_trajectories], **hooks},
        **{queue: {**kwargs, **hooks} for queue, kwargs in sandbox.workers().items()},
    }
    async with running_workers(client, by_queue):
        turns = await run_as_children(client, [job], 1, "test")

    plain_calls: list[Call] = []
    fresh = ScriptedSandbox(store, "a")  # the same queue, its session numbers from 0 again
    plain = PlainTask(
        recorded(activity_methods(fresh, policy.generate, rewards.write_trajectories), plain_calls)
    )
    result = await plain(job)

    assert [name for name, _ in plain_calls] == [name for name, _ in through_temporal]
    assert plain_calls == through_temporal
    assert turns == [result.turns] and result.state == "DONE"
    ends = [str(end) for end in result.ends]
    assert ends[:2] == ["submitted", "submitted"]
    assert ends[2] == ("step_budget" if "max_context_tokens" not in budget else "context_budget")
