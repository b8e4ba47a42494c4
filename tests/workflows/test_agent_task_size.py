"""A new task past the size bound (`MAX_GROUP_STEPS` episode-steps) fails at its start, naming
its shape; a task started before the bound, valid then, replays as it ran (real dev server;
workflows/agent_task.py `TASK_SIZE_PATCH`).

The bound was first a validator of `AgentTaskInput`: the replay of a task (or a training run's
child input) started before it, with a larger G × turns, then failed parsing before the
workflow's first patch check and was retried for ever."""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

import contracts.task as task_contracts
from contracts.errors import ErrorType
from contracts.names import Queue
from contracts.task import AgentTaskInput, TaskSpec
from tests.workflows.harness import connect, running_workers, start
from tests.workflows.replaying import replay
from tests.workflows.test_replay_parts import has_marker, recorded
from workflows.agent_task import TASK_SIZE_PATCH, AgentTaskWorkflow

pytestmark = pytest.mark.asyncio
TASK = TaskSpec(
    id="add", prompt="Write add.", entry_point="add", tests="def check(c):\n    assert c(1)\n"
)


async def test_a_new_task_past_the_bound_fails_at_its_start(temporal_server, namespace) -> None:
    client = await connect(temporal_server.address, namespace)
    run_id = f"size-{uuid.uuid4().hex[:6]}"
    task = AgentTaskInput(task=TASK, run_id=run_id, group_size=128, max_turns=20)
    async with running_workers(client, {Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]}}):
        handle = await start(client, task)
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ErrorType.INVALID_TASK
    assert cause.non_retryable and "128 × 20 = 2,560 episode-steps" in str(cause)
    history = await handle.fetch_history()
    assert any(
        TASK_SIZE_PATCH.encode() in e.SerializeToString()
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
    ), history.events
    await replay(history, AgentTaskWorkflow)


async def test_a_task_started_before_the_bound_replays(monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded 16 × 14 group, as if it had been past the bound when it ran: no marker asked
    then, so its replay goes on as it ran (a validator failed it here)."""
    history = recorded("agent_task_trajectory_parts.json.gz")
    assert has_marker(history)  # the parts patch's: the size patch has none
    monkeypatch.setattr(task_contracts, "MAX_GROUP_STEPS", 16 * 14 - 1)
    assert task_contracts.group_steps_problem(16, 14)
    await replay(history, AgentTaskWorkflow)
