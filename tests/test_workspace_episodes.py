"""Workspace episodes end to end: `tempered up` on free ports, the real agent-tasks, sandbox
and rewards worker processes, one task of the built-in `workspace` suite; only the model is
scripted (in this process), so the verdicts are known: an episode that runs the task's reference
fix with `bash`, runs the example tests and submits is solved; one that submits at once is not;
one that writes malformed calls runs out of steps. The trajectories carry every tool call and
observation, and `tempered runs show --task` prints them."""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from contracts.episode import ToolCall
from contracts.names import Queue
from contracts.rollout import AgentTaskResult
from contracts.task import AgentTaskInput, SamplingParams
from contracts.trajectory import Trajectory
from infra.tasks import load_workspace_suite
from tests.workflows.harness import ScriptedModel, running_workers
from workflows.agent_task import AgentTaskWorkflow

if TYPE_CHECKING:
    from tests.fixtures.stack import Stack

RUN = "ws-e2e"


@pytest.mark.asyncio
async def test_workspace_episodes_through_the_real_sandbox_workers(stack: Stack) -> None:
    for queue in (Queue.AGENT_TASKS, Queue.SANDBOX, Queue.REWARDS):
        stack.start_worker(queue)
    store = stack.store()
    (task,) = load_workspace_suite("workspace")[:1]
    for key, data in task.objects.items():
        store.put_bytes(key, data)
    fix = task.spec.canonical_solution
    assert fix, "the workspace suite ships a reference fix per task"
    example_tests = re.search(r"`(python3 [^`]+)`", task.spec.prompt)
    assert example_tests, task.spec.prompt

    def script(sample: int, step: int) -> str | ToolCall:
        if sample == 0:
            plan: list[str | ToolCall] = [
                ToolCall(name="bash", arguments={"command": fix}),
                ToolCall(name="bash", arguments={"command": example_tests.group(1)}),
                ToolCall(name="submit"),
            ]
            return plan[step]
        if sample == 1:
            return ToolCall(name="submit")
        return "I would fix webtext.py."  # no call: an error observation, a step spent

    model = ScriptedModel(store, script)
    task_input = AgentTaskInput(
        task=task.spec,
        run_id=RUN,
        group_size=3,
        max_turns=4,
        sampling=SamplingParams(max_new_tokens=64, stop_after_tool_call=True),
        heartbeat_timeout_s=10,
    )
    client = await Client.connect(
        stack.settings.temporal.address, data_converter=pydantic_data_converter
    )
    stack.wait_workers_ready(queues=[Queue.AGENT_TASKS, Queue.SANDBOX, Queue.REWARDS])
    async with running_workers(client, {Queue.INFERENCE: {"activities": [model.generate]}}):
        result: AgentTaskResult = await asyncio.wait_for(
            client.execute_workflow(
                AgentTaskWorkflow.run,
                task_input,
                id=f"{RUN}-{task.spec.id}",
                task_queue=Queue.AGENT_TASKS.value,
            ),
            timeout=300,
        )
    assert result.solved == [True, False, False], stack.worker_logs()
    # the verdict's score (the share of hidden tests passed) is the reward: the untouched
    # workspace of samples 1 and 2 earns the same partial score
    assert result.rewards[0] == 1.0 and result.rewards[1] == result.rewards[2] < 1.0
    assert result.ends == ["submitted", "submitted", "step_budget"] and result.steps == [3, 1, 4]
    solved = store.get_model(result.trajectories[0].key, Trajectory)
    observations = [store.get_text(s.observation.key) for s in solved.steps if s.observation]
    assert len(observations) == 3 and solved.verifier is not None
    stray = store.get_model(result.trajectories[2].key, Trajectory)
    assert all(s.call and s.call.error for s in stray.steps)

    shown = stack.tempered("runs", "show", RUN, "--task", task.spec.id, "--sample", "0")
    assert shown.returncode == 0, shown.stderr
    assert "ended submitted, reward +1.000, solved" in shown.stdout
    assert "bash(" in shown.stdout and "submit({})" in shown.stdout
