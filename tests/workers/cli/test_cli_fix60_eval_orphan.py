"""`tempered eval` and a task's start that fails after the server made the workflow: the
response lost (the SDK raises DEADLINE_EXCEEDED, or its retry meets the workflow it made), or a
start cut short by Ctrl-C that then fails so. The evaluation had no handle to it: `_cancel_all`
never saw it, the line counted only the others "cancelled", and the workflow ran on, waiting
for a model. Now each failed start is cancelled by its workflow id, and a cancel that fails
names it on the line.

Real Temporal dev server running a worker of the tasks' workflows only (a task waits at its
first generate for ever; a cancel ends it CANCELED), real SeaweedFS. The lost response is a
client interceptor: the start reaches the server, then the call raises."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.client import (
    CancelWorkflowInput,
    Interceptor,
    OutboundInterceptor,
    StartWorkflowInput,
    WorkflowHandle,
)
from temporalio.service import RPCError, RPCStatusCode

from contracts.names import Queue
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import load_suite
from tests.workers.cli.eval_setup import RUN, Capture, recorded_run
from tests.workers.cli.eval_setup import settings as settings  # a fixture
from tests.workers.cli.test_eval_errors_cancel import Status, faulty_client, lost, settled
from tests.workflows.harness import connect, running_workers
from workers.cli import eval_workflows, run
from workflows.agent_task import AgentTaskWorkflow


def late() -> RPCError:
    """What a start raises whose response did not come back in time."""
    return RPCError("Deadline Exceeded", RPCStatusCode.DEADLINE_EXCEEDED, b"")


class MadeThenLost(Interceptor):
    """The `starts`-th start reaches the server (after the others are made; with `held`, once
    `release` is set), then raises `late()`; with `cancel_fails`, that workflow's cancel raises
    `lost()`. `made`: the ids the server made, in order."""

    def __init__(self, starts: int, held: bool = False, cancel_fails: bool = False) -> None:
        self.starts, self.held, self.cancel_fails = starts, held, cancel_fails
        self.made, self.calls = list[str](), 0
        self.in_flight, self.release = False, False

    async def all_made(self, count: int) -> None:
        while len(self.made) < count:  # polled: the CLI runs its own event loop in a thread
            await asyncio.sleep(0.05)

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        faults = self

        class Faulty(OutboundInterceptor):
            async def start_workflow(self, input: StartWorkflowInput) -> WorkflowHandle[Any, Any]:
                faults.calls += 1
                last = faults.calls == faults.starts
                if last:
                    await faults.all_made(faults.starts - 1)
                    faults.in_flight = True
                    while faults.held and not faults.release:
                        await asyncio.sleep(0.05)
                handle = await super().start_workflow(input)
                faults.made.append(handle.id)
                if last:
                    raise late()
                return handle

            async def cancel_workflow(self, input: CancelWorkflowInput) -> None:
                if faults.cancel_fails and input.id == faults.made[-1]:
                    raise lost()
                await super().cancel_workflow(input)

        return Faulty(next)


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_a_start_whose_response_was_lost_is_cancelled_all_the_same(
    store: ObjectStore, settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    recorded_run(store)  # 4 held-out tasks, 3 at a time: the 3rd start fails once made
    faults = MadeThenLost(starts=3)
    faulty_client(monkeypatch, faults)  # type: ignore[arg-type]  # the same hooks
    argv = ["eval", "--run", RUN, "--policy", "0", "--concurrency", "3", "--wait-for-workers"]
    client = await connect(settings.temporal.address, settings.temporal.namespace)
    async with running_workers(client, {Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]}}):
        code = await asyncio.wait_for(asyncio.to_thread(run, argv, settings), 90)
        found = await settled(client, faults.made)
    err = " ".join(capsys.readouterr().err.split())
    assert len(faults.made) == 3, faults.made
    assert set(found.values()) == {Status.CANCELED}, found  # the orphan waited for a model
    assert code == 1, err
    assert "the 3 started task(s) were cancelled where still running" in err, err


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_start_cut_short_that_fails_once_made_is_cancelled(
    store: ObjectStore, settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    """Ctrl-C while the 3rd start is on its way; it is made, then fails."""
    faults = MadeThenLost(starts=3, held=True)
    faulty_client(monkeypatch, faults)  # type: ignore[arg-type]
    spec = recorded_run(store)
    tasks = load_suite("starter", split="heldout")[:3]
    client = await connect(settings.temporal.address, settings.temporal.namespace)
    async with running_workers(client, {Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]}}):
        evaluation = asyncio.create_task(
            eval_workflows.evaluate(settings, spec, tasks, "rec-eval-v0--starter-o", 0, 3)
        )
        while not faults.in_flight:
            await asyncio.sleep(0.05)
        evaluation.cancel()
        await asyncio.sleep(0.2)  # the cancel reaches the shielded start first
        faults.release = True
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(evaluation, 60)
        found = await settled(client, faults.made)
    err = " ".join(capsys.readouterr().err.split())
    assert len(faults.made) == 3, faults.made
    assert set(found.values()) == {Status.CANCELED}, found
    assert "interrupted; the 3 started task(s) were cancelled where still running" in err, err


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_failed_start_whose_cancel_fails_is_named(
    store: ObjectStore, settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    faults = MadeThenLost(starts=2, cancel_fails=True)
    faulty_client(monkeypatch, faults)  # type: ignore[arg-type]
    spec = recorded_run(store)
    tasks = load_suite("starter", split="heldout")[:2]
    client = await connect(settings.temporal.address, settings.temporal.namespace)
    async with running_workers(client, {Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]}}):
        with pytest.raises(RPCError):
            await asyncio.wait_for(
                eval_workflows.evaluate(settings, spec, tasks, "rec-eval-v0--starter-n", 0, 2), 60
            )
        first, orphan = faults.made
        found = await settled(client, [first])
        still = (await client.get_workflow_handle(orphan).describe()).status
        await client.get_workflow_handle(orphan).cancel()  # the user's part, as the line says
    err = " ".join(capsys.readouterr().err.split())
    assert set(found.values()) == {Status.CANCELED}, found
    assert still is Status.RUNNING
    assert "the 1 started task(s) were cancelled where still running" in err, err
    assert "1 whose start failed may have been started, and could not be cancelled" in err, err
    assert "(cannot reach Temporal" in err and orphan in err and "still running there" not in err
