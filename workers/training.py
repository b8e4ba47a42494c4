"""Start a training run and follow it: what `tempered train`, `tempered status` and
bench/vs_trl.py share (none of them reaches into another's module for it).

    handle = await start_run(client, run_input)       # a TrainingRunWorkflow on agent-tasks
    result = asyncio.ensure_future(handle.result())
    async for progress in watch(handle, result):       # RunProgress, or None before it answers
        ...
    runs = await running_runs(client)                  # every running training run, with progress
    found = await attach(client, run_id)               # a run to follow again, or to report
    said = await stop_run(client, run_id, reason="enough", cancel=False)   # `tempered stop`

Progress is the workflow's `progress` query, read as the typed `contracts.run.RunProgress`. A
run looked up by id (`attach`, `running_handle`, `stop_run`) that is not there is a ValueError
saying so, or naming the namespace where the server has no such namespace.
Starting the stack and the workers is not done here (see `workers.background`, `infra.stack`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field
from temporalio.api.errordetails.v1 import NamespaceNotFoundFailure
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from contracts.names import Queue, SearchAttr, Workflow, run_workflow_id
from contracts.run import RunProgress, TrainingRunInput, TrainingRunResult
from workflows.budget import TASK_TIMEOUT
from workflows.search import KEYS
from workflows.training_run import TrainingRunWorkflow

POLL_S = 2.0
"""How often `watch` asks a run for its progress."""
QUERY_TIMEOUT = timedelta(seconds=5)
"""A run that does not answer within this (no agent-tasks worker polls) reports no progress."""

RunHandle = WorkflowHandle[TrainingRunWorkflow, TrainingRunResult]


def workflow_id(run_id: str) -> str:
    """Id of the TrainingRunWorkflow of `run_id` (one run, one workflow)."""
    return run_workflow_id(run_id)


async def start_run(client: Client, run_input: TrainingRunInput) -> RunHandle:
    """Start the TrainingRunWorkflow of `run_input` on the agent-tasks queue, findable by its
    TemperedRunId from the start (the workflow sets it again on its first task)."""
    return await client.start_workflow(
        TrainingRunWorkflow.run,
        run_input,
        id=workflow_id(run_input.run_id),
        task_queue=Queue.AGENT_TASKS.value,
        task_timeout=TASK_TIMEOUT,
        search_attributes=TypedSearchAttributes(
            [SearchAttributePair(KEYS[SearchAttr.RUN_ID], run_input.run_id)]
        ),
    )


async def query_progress(handle: RunHandle) -> RunProgress | None:
    """The run's progress; None while it cannot answer (before its first workflow task, or
    with no agent-tasks worker polling)."""
    try:
        return await handle.query(TrainingRunWorkflow.progress, rpc_timeout=QUERY_TIMEOUT)
    except (WorkflowQueryFailedError, RPCError):
        return None


async def watch(
    handle: RunHandle, done: asyncio.Future[Any], poll_s: float = POLL_S
) -> AsyncIterator[RunProgress | None]:
    """The run's progress every `poll_s` seconds until `done` (its result) completes."""
    while not done.done():
        yield await query_progress(handle)
        await asyncio.wait([done], timeout=poll_s)


class RunningRun(BaseModel):
    """A training run that is running now, as `tempered status` shows it."""

    run_id: str = Field(description="The TemperedRunId search attribute.")
    workflow_id: str
    progress: RunProgress | None = Field(description="None: it did not answer the query.")


async def running_runs(client: Client) -> list[RunningRun]:
    """Every running TrainingRunWorkflow (a visibility query), with its progress."""
    query = f'WorkflowType = "{Workflow.TRAINING_RUN.value}" AND ExecutionStatus = "Running"'
    executions = [execution async for execution in client.list_workflows(query)]

    async def describe(execution: WorkflowExecution) -> RunningRun:
        handle: RunHandle = client.get_workflow_handle_for(
            TrainingRunWorkflow.run, execution.id, run_id=execution.run_id
        )
        run_id = execution.typed_search_attributes.get(KEYS[SearchAttr.RUN_ID])
        return RunningRun(
            run_id=run_id or execution.id,
            workflow_id=execution.id,
            progress=await query_progress(handle),
        )

    return list(await asyncio.gather(*(describe(e) for e in executions)))


class NoSuchRun(ValueError):
    """No training run of that id (or no such namespace): nothing of it to attach to."""


async def _describe(client: Client, run_id: str) -> tuple[RunHandle, WorkflowExecutionDescription]:
    """The handle of training run `run_id` (its current segment) and what Temporal says of it;
    a ValueError naming the run when there is none, or naming the namespace when the server has
    no such namespace (both are NOT_FOUND: told apart by the error's details)."""
    handle: RunHandle = client.get_workflow_handle_for(TrainingRunWorkflow.run, workflow_id(run_id))
    try:
        return handle, await handle.describe()
    except RPCError as err:
        if err.status is not RPCStatusCode.NOT_FOUND:
            raise
        if _no_namespace(err):
            raise NoSuchRun(_namespace_missing(client)) from None
        raise NoSuchRun(f"no training run {run_id!r} (workflow {handle.id})") from None


def _no_namespace(err: RPCError) -> bool:
    """Whether a NOT_FOUND `err` is the namespace's (the server's NamespaceNotFoundFailure), not
    the workflow's."""
    details = err.grpc_status.details
    return any(detail.Is(NamespaceNotFoundFailure.DESCRIPTOR) for detail in details)


def _namespace_missing(client: Client) -> str:
    """Why no run can be looked up where `client` looks: its server lacks its namespace (a
    misspelt setting, or a fresh server that never made it)."""
    address = client.service_client.config.target_host
    return (
        f"Temporal at {address} has no namespace {client.namespace!r} (the `temporal.namespace`"
        " setting, TEMPERED_TEMPORAL__NAMESPACE), so it holds none of the runs; set it to one"
        f" the server has (`temporal operator namespace list --address {address}` lists them)"
    )


def state_name(status: WorkflowExecutionStatus | None) -> str:
    """`running`, `completed`, `failed`, `terminated`, `timed out`, …"""
    return status.name.lower().replace("_", " ") if status else "unknown"


async def running_handle(client: Client, run_id: str) -> RunHandle:
    """The handle of training run `run_id` (its current segment); a ValueError naming the run
    when there is none or it is no longer running."""
    handle, description = await _describe(client, run_id)
    if description.status is not WorkflowExecutionStatus.RUNNING:
        state = state_name(description.status)
        raise ValueError(f"training run {run_id!r} is not running ({state})")
    return handle


@dataclass(frozen=True)
class FoundRun:
    """A training run to follow, or one that has closed, to report (`attach`)."""

    handle: RunHandle
    run_input: TrainingRunInput
    started: datetime
    """When its first segment started."""
    closed: datetime | None
    """When it closed; None while it runs."""
    state: str
    """`state_name` of its current segment's status."""


async def attach(client: Client, run_id: str) -> FoundRun:
    """Run `run_id`, running or closed (a run that ended while no one followed it still has
    its report to write, from its result): its handle, its input (from its current segment's
    first event), when its first segment started and when it closed."""
    handle, description = await _describe(client, run_id)
    first = await anext(aiter(handle.fetch_history_events(page_size=1)))
    payloads = first.workflow_execution_started_event_attributes.input.payloads
    [run_input] = await client.data_converter.decode(payloads, [TrainingRunInput])
    this_segment = first.event_time.ToDatetime(tzinfo=UTC)
    query = f'WorkflowId = "{handle.id}"'  # every segment, the continued-as-new ones too
    started = [execution.start_time async for execution in client.list_workflows(query)]
    running = description.status is WorkflowExecutionStatus.RUNNING
    return FoundRun(
        handle=handle,
        run_input=run_input,
        started=min(started, default=this_segment),
        closed=None if running else description.close_time or datetime.now(UTC),
        state=state_name(description.status),
    )


async def stop_run(client: Client, run_id: str, *, reason: str, cancel: bool) -> str:
    """Tell run `run_id` to stop starting tasks (its tasks in flight, its learner's last step and
    the final evaluation still run), or with `cancel` cancel it and its learner now; one line
    saying what was done."""
    handle = await running_handle(client, run_id)
    if cancel:
        await handle.cancel()
        return (
            f"cancel requested for run {run_id}: its tasks in flight are cancelled (each closes its sandbox"
            " sessions as it ends), and its learner ends once a step in progress has stopped (it"
            " publishes nothing more)"
        )
    await handle.signal(TrainingRunWorkflow.stop, reason)
    return (
        f"told run {run_id} to stop: no new tasks; the ones in flight, the learner's last step "
        f"and the final evaluation still run (follow: tempered train --attach {run_id})"
    )
