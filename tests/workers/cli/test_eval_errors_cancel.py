"""`tempered eval` stopped by an error other than a failed task or Ctrl-C -- an RPCError once
Temporal was unreachable past the client's retries, from a task's `result()` or from a start --
cancels in Temporal every task workflow it started, starts no other, and says so (exit 1):
`asyncio.gather` raised at once and they ran on there, waiting for a model. The line counts the
cancels that went through and names a workflow whose cancel failed.

Real Temporal dev server running a worker of the tasks' workflows only (a task waits at its first
generate, for ever; a cancel ends it CANCELED as in production), real SeaweedFS. The lost
connection is a client interceptor that raises the RPCError the SDK raises past its retries, for
one call, where the server would have answered."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest
from temporalio.client import (
    CancelWorkflowInput,
    Client,
    FetchWorkflowHistoryEventsInput,
    Interceptor,
    OutboundInterceptor,
    StartWorkflowInput,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowHistoryEventAsyncIterator,
)
from temporalio.service import RPCError, RPCStatusCode

from contracts.names import Queue
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import load_suite
from tests.workers.cli.eval_setup import RUN, Capture, recorded_run
from tests.workers.cli.eval_setup import settings as settings  # a fixture
from tests.workflows.harness import connect, running_workers
from workers import runtime
from workers.cli import eval_workflows, run
from workflows.agent_task import AgentTaskWorkflow

QUERY = 'WorkflowType="AgentTaskWorkflow"'
Status = WorkflowExecutionStatus


def lost() -> RPCError:
    """What a call raises once no Temporal answered past the client's retries."""
    return RPCError("transport error: connection lost", RPCStatusCode.UNAVAILABLE, b"")


class Faults(Interceptor):
    """The evaluation's client, one call of it losing Temporal: the first task's `result()` once
    `starts` workflows are made (`result`), the `starts`-th start once the others are made, before
    it reaches the server (`start`), or the first task's cancel (`cancel`). `made`: the ids of the
    workflows the server made, in order."""

    def __init__(self, fault: str, starts: int) -> None:
        self.fault, self.starts, self.made, self.calls = fault, starts, list[str](), 0

    async def all_made(self, count: int) -> None:
        while len(self.made) < count:  # polled: the CLI runs its own event loop in a thread
            await asyncio.sleep(0.05)

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        faults = self

        class History(WorkflowHistoryEventAsyncIterator):
            async def fetch_next_page(self, *, page_size: int | None = None) -> None:
                await faults.all_made(faults.starts)
                raise lost()

        class Faulty(OutboundInterceptor):
            async def start_workflow(self, input: StartWorkflowInput) -> WorkflowHandle[Any, Any]:
                faults.calls += 1
                if faults.fault == "start" and faults.calls == faults.starts:
                    await faults.all_made(faults.starts - 1)
                    raise lost()
                handle = await super().start_workflow(input)
                faults.made.append(handle.id)
                return handle

            def fetch_workflow_history_events(
                self, input: FetchWorkflowHistoryEventsInput
            ) -> WorkflowHistoryEventAsyncIterator:
                if faults.fault == "result" and input.id == faults.made[0]:
                    return History(None, input)  # type: ignore[arg-type]  # never reaches it
                return super().fetch_workflow_history_events(input)

            async def cancel_workflow(self, input: CancelWorkflowInput) -> None:
                if faults.fault == "cancel" and input.id == faults.made[0]:
                    raise lost()
                await super().cancel_workflow(input)

        return Faulty(next)


def faulty_client(monkeypatch: pytest.MonkeyPatch, faults: Faults) -> None:
    async def connect_faulty(given: Settings) -> Client:
        return await runtime.connect(given, interceptors=[faults])

    monkeypatch.setattr(eval_workflows, "connect", connect_faulty)


async def settled(client: Client, ids: Sequence[str]) -> dict[str, Status | None]:
    """Each workflow's status (`describe`'s, not visibility's, which lags) once none of them is
    RUNNING, or after 30 s."""
    deadline = time.monotonic() + 30  # the worker turns each cancel into CANCELED
    while True:
        found = {i: (await client.get_workflow_handle(i).describe()).status for i in ids}
        if Status.RUNNING not in found.values() or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.5)


@pytest.mark.asyncio
@pytest.mark.timeout(180)
@pytest.mark.parametrize(("fault", "made"), [("result", 3), ("start", 2)])
async def test_an_rpc_error_cancels_every_task_started_and_starts_no_other(
    fault: str,
    made: int,
    store: ObjectStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Capture,
) -> None:
    recorded_run(store)  # 4 held-out tasks of `starter`, 3 at a time: the 4th waits for a slot
    faults = Faults(fault, starts=3)
    faulty_client(monkeypatch, faults)
    argv = ["eval", "--run", RUN, "--policy", "0", "--concurrency", "3", "--wait-for-workers"]
    client = await connect(settings.temporal.address, settings.temporal.namespace)
    async with running_workers(client, {Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]}}):
        code = await asyncio.wait_for(asyncio.to_thread(run, argv, settings), 90)
        found = await settled(client, faults.made)
        await asyncio.sleep(1.0)  # a task left waiting for a slot would start in this time
        listed = [w.id async for w in client.list_workflows(QUERY)]
    err = " ".join(capsys.readouterr().err.split())
    assert len(faults.made) == made, faults.made
    assert set(found.values()) == {Status.CANCELED}, found  # none runs on, waiting for a model
    assert sorted(listed) == sorted(faults.made), listed  # the 4th never started
    assert code == 1, err
    assert f"the {made} started task(s) were cancelled where still running" in err, err
    assert "cannot reach Temporal (transport error: connection lost)" in err, err
    assert "Traceback" not in err, err


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_the_line_counts_the_cancels_that_went_through_and_names_the_others(
    store: ObjectStore, settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    """Ctrl-C (`asyncio.run` cancels the evaluation) once 3 tasks started, one cancel failing:
    it said all 3 "were cancelled", and that one ran on unnamed."""
    faults = Faults("cancel", starts=3)
    faulty_client(monkeypatch, faults)
    spec = recorded_run(store)
    tasks = load_suite("starter", split="heldout")[:3]
    client = await connect(settings.temporal.address, settings.temporal.namespace)
    async with running_workers(client, {Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]}}):
        evaluation = asyncio.create_task(
            eval_workflows.evaluate(settings, spec, tasks, "rec-eval-v0--starter-c", 0, 3)
        )
        await asyncio.wait_for(faults.all_made(3), 60)
        evaluation.cancel()
        with pytest.raises(asyncio.CancelledError):
            await evaluation
        missed, *cancelled = faults.made
        found = await settled(client, cancelled)
        still = (await client.get_workflow_handle(missed).describe()).status
        await client.get_workflow_handle(missed).cancel()  # the user's part, as the line says
    err = " ".join(capsys.readouterr().err.split())
    assert set(found.values()) == {Status.CANCELED}, found
    assert still is Status.RUNNING
    assert "interrupted; the 2 started task(s) were cancelled where still running" in err, err
    assert "1 could not be (cannot reach Temporal" in err and missed in err, err
