"""Bad input to a workflow started or signalled by hand (`temporal workflow start --input …`,
`temporal workflow signal …`) fails the workflow at once, or is taken as no reason, on the real
dev server; it never leaves a workflow task failing for ever.

Before, only a JSON object reached `parse_task_input`: a string or null input failed decoding
("Failed decoding arguments"), no input or two inputs failed the call to `run`, and a training
run's input with a bad field failed decoding too, each a workflow task failure retried for ever.
An `abort` signal with no input or two inputs failed every later workflow task of its task (a
`stop` with two, its run's), and `abort` with a number was dropped."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError

from contracts.errors import ErrorType
from contracts.names import Queue, Signal
from contracts.run import TrainingRunInput
from contracts.task import AgentTaskInput, TaskSpec
from tests.workflows.harness import connect, running_workers
from workflows.agent_task import AgentTaskWorkflow
from workflows.training_run import STOPPED_BY_SIGNAL, TrainingRunWorkflow

pytestmark = pytest.mark.asyncio
TASK = AgentTaskInput(
    task=TaskSpec(
        id="add", prompt="Write add.", entry_point="add", tests="def check(c):\n    assert c(1)\n"
    ),
    run_id="bad-input",
)
RUN = TrainingRunInput(run_id="bad-input", steps=2, group_size=2)
WORKFLOWS: dict[Queue | str, dict[str, Sequence[Any]]] = {
    Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow, TrainingRunWorkflow]}
}


def task_failure(event: HistoryEvent) -> str | None:
    """What failed the workflow task `event` records (None: it records none, or Temporal's own
    `UnhandledCommand`, a signal that came while the task ran: the task is simply run again)."""
    if event.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
        return None
    failed = event.workflow_task_failed_event_attributes
    if failed.cause == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND:
        return None
    return failed.failure.message


async def outcome(handle: WorkflowHandle[Any, Any], timeout_s: float = 30) -> ApplicationError:
    """The workflow's failure once it has failed; an AssertionError as soon as one of its
    workflow tasks fails instead (retried for ever), or if neither came within `timeout_s`."""
    for _ in range(int(timeout_s / 0.2)):
        for event in (await handle.fetch_history()).events:
            if (why := task_failure(event)) is not None:
                raise AssertionError(f"a workflow task failed: {why}")
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED:
                failure = event.workflow_execution_failed_event_attributes.failure
                info = failure.application_failure_info
                return ApplicationError(
                    failure.message, type=info.type, non_retryable=info.non_retryable
                )
        await asyncio.sleep(0.2)
    raise AssertionError(f"the workflow had not failed {timeout_s} s on")


async def started(client: Client, workflow: str, args: Sequence[Any]) -> WorkflowHandle[Any, Any]:
    return await client.start_workflow(
        workflow, args=args, id=f"bad-{uuid.uuid4().hex[:8]}", task_queue=Queue.AGENT_TASKS.value
    )


TASK_INPUTS: dict[str, tuple[list[Any], str]] = {
    "a string": (
        ["hello"],
        "invalid task: the input is a str, where the workflow takes one AgentTaskInput",
    ),
    "null": ([None], "invalid task: no input, where the workflow takes one AgentTaskInput"),
    "no input": ([], "invalid task: no input, where the workflow takes one AgentTaskInput"),
    "a list": (
        [[1, 2]],
        "invalid task: the input is a list, where the workflow takes one AgentTaskInput",
    ),
    "two inputs": (
        [TASK.model_dump(mode="json")] * 2,
        "invalid task: 2 inputs, where the workflow takes one AgentTaskInput",
    ),
}


@pytest.mark.parametrize("name", list(TASK_INPUTS))
async def test_a_task_started_with_bad_input_fails_at_once(
    temporal_server, namespace, name: str
) -> None:
    args, said = TASK_INPUTS[name]
    client = await connect(temporal_server.address, namespace)
    async with running_workers(client, WORKFLOWS):
        cause = await outcome(await started(client, "AgentTaskWorkflow", args))
    assert cause.type == ErrorType.INVALID_TASK and cause.non_retryable, cause
    assert cause.message.startswith(said), cause.message


RUN_INPUTS: dict[str, tuple[list[Any], str]] = {
    "a string": (
        ["hello"],
        "invalid run: the input is a str, where the workflow takes one TrainingRunInput",
    ),
    "no input": ([], "invalid run: no input, where the workflow takes one TrainingRunInput"),
    "null": ([None], "invalid run: no input, where the workflow takes one TrainingRunInput"),
    "a list": (
        [[1, 2]],
        "invalid run: the input is a list, where the workflow takes one TrainingRunInput",
    ),
    "two inputs": (
        [RUN.model_dump(mode="json")] * 2,
        "invalid run: 2 inputs, where the workflow takes one TrainingRunInput",
    ),
    "a bad field": ([{"run_id": "r", "steps": 0}], "invalid run: steps: Input should be greater"),
}


@pytest.mark.parametrize("name", list(RUN_INPUTS))
async def test_a_run_started_with_bad_input_fails_at_once(
    temporal_server, namespace, name: str
) -> None:
    args, said = RUN_INPUTS[name]
    client = await connect(temporal_server.address, namespace)
    async with running_workers(client, WORKFLOWS):
        cause = await outcome(await started(client, "TrainingRunWorkflow", args))
    assert cause.type == ErrorType.INVALID_TASK and cause.non_retryable, cause
    assert cause.message.startswith(said), cause.message


async def waiting(handle: WorkflowHandle[Any, Any], timeout_s: float = 30) -> None:
    """Once the workflow has scheduled its first activity (which no worker here runs)."""
    for _ in range(int(timeout_s / 0.2)):
        events = [e.event_type for e in (await handle.fetch_history()).events]
        if EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED in events:
            return
        assert EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED not in events
        await asyncio.sleep(0.2)
    raise AssertionError(f"no activity scheduled {timeout_s} s on")


async def handled(handle: WorkflowHandle[Any, Any], timeout_s: float = 30) -> None:
    """Once a workflow task completed after the last signal; an AssertionError if one failed."""
    for _ in range(int(timeout_s / 0.2)):
        events = (await handle.fetch_history()).events
        for event in events:
            if (why := task_failure(event)) is not None:
                raise AssertionError(f"a workflow task failed: {why}")
        signalled = [
            i
            for i, e in enumerate(events)
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        ]
        completed = [
            i
            for i, e in enumerate(events)
            if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
        ]
        if signalled and completed and completed[-1] > signalled[-1]:
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"the signal had not been handled {timeout_s} s on")


ABORTS: dict[str, tuple[list[Any], str]] = {
    "no input": ([], "aborted by signal"),
    "a number": ([5], "aborted by signal"),
    "two inputs": (["first", "second"], "first"),
}


@pytest.mark.parametrize("name", list(ABORTS))
async def test_an_abort_with_bad_input_aborts_with_a_reason(
    temporal_server, namespace, name: str
) -> None:
    """The task waits at its first step (no inference worker) when the signal comes."""
    args, reason = ABORTS[name]
    client = await connect(temporal_server.address, namespace)
    async with running_workers(client, WORKFLOWS):
        handle = await started(client, "AgentTaskWorkflow", [TASK.model_dump(mode="json")])
        await waiting(handle)
        await handle.signal(Signal.ABORT, args=args)
        await handled(handle)
        status = await handle.query(AgentTaskWorkflow.status)
        await handle.terminate("test over")
    assert status.aborted_reason == reason


STOPS: dict[str, tuple[list[Any], str]] = {
    "no input": ([], STOPPED_BY_SIGNAL),
    "two inputs": (["first", "second"], "first"),
}


@pytest.mark.parametrize("name", list(STOPS))
async def test_a_stop_with_bad_input_stops_with_a_reason(
    temporal_server, namespace, name: str
) -> None:
    """The run waits for its first activity (no worker) when the signal comes."""
    args, reason = STOPS[name]
    client = await connect(temporal_server.address, namespace)
    async with running_workers(client, WORKFLOWS):
        handle = await started(client, "TrainingRunWorkflow", [RUN.model_dump(mode="json")])
        await waiting(handle)
        await handle.signal(Signal.STOP, args=args)
        await handled(handle)
        progress = await handle.query(TrainingRunWorkflow.progress)
        await handle.terminate("test over")
    assert progress.stopping == reason
