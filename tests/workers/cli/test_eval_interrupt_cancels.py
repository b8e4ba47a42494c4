"""Ctrl-C on `tempered eval` while it starts its tasks cancels in Temporal every task workflow it
started, then exits 130 saying so: the workflows it had started ran on on the server (waiting
for a model, here for ever), with nothing to end them.

The command is a real `python -m workers.cli eval` process sent SIGINT (with Ctrl-C's default
action, `DEFAULT_SIGINT`: a CI run that started the suite in the background ignored it, and the
test timed out); the real Temporal dev server runs a worker of the tasks' workflows only, so
that a task waits at its first generate (no inference worker) and a cancel ends it as it ends
one in production (CANCELED). Real SeaweedFS; the run's version 0 names no files."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import (
    Client,
    Interceptor,
    OutboundInterceptor,
    StartWorkflowInput,
    WorkflowExecutionStatus,
    WorkflowHandle,
)
from temporalio.service import RPCError, RPCStatusCode

from contracts.names import Queue
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import load_suite
from tests.fixtures.signals import DEFAULT_SIGINT
from tests.workers.cli.eval_setup import RUN, recorded_run
from tests.workers.cli.eval_setup import settings as settings
from tests.workflows.harness import connect, running_workers
from workers import runtime
from workers.cli import eval_workflows
from workflows.agent_task import AgentTaskWorkflow

QUERY = 'WorkflowType="AgentTaskWorkflow"'


def environment(settings: Settings) -> dict[str, str]:
    """The command's settings as the `TEMPERED_` variables it reads."""
    s3, temporal = settings.s3, settings.temporal
    assert s3.endpoint is not None
    return {
        **os.environ,
        "TEMPERED_HOME": str(settings.home),
        "TEMPERED_S3__ENDPOINT": s3.endpoint,
        "TEMPERED_S3__BUCKET": s3.bucket,
        "TEMPERED_S3__ACCESS_KEY": s3.access_key,
        "TEMPERED_S3__SECRET_KEY": s3.secret_key.get_secret_value(),
        "TEMPERED_TEMPORAL__ADDRESS": temporal.address,
        "TEMPERED_TEMPORAL__NAMESPACE": temporal.namespace,
    }


async def statuses(client: Client) -> dict[str, WorkflowExecutionStatus | None]:
    """Each task workflow's status, as `describe` gives it (not visibility's, which lags)."""
    ids = [w.id async for w in client.list_workflows(QUERY)]
    return {i: (await client.get_workflow_handle(i).describe()).status for i in ids}


@pytest.mark.asyncio
@pytest.mark.timeout(240)
async def test_ctrl_c_while_tasks_start_cancels_every_one_started(
    store: ObjectStore, settings: Settings, tmp_path: Path
) -> None:
    """One at a time, so that the 3 tasks left wait for the slot a cancelled task frees: none of
    them may start once the Ctrl-C came, and exactly one workflow is made (`--concurrency 2` and
    "at most 2" let a start after the Ctrl-C pass wherever one had started before it)."""
    recorded_run(store)  # 4 held-out tasks of `starter`
    client = await connect(settings.temporal.address, settings.temporal.namespace)
    argv = ["eval", "--run", RUN, "--policy", "0", "--concurrency", "1", "--wait-for-workers"]
    async with running_workers(client, {Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]}}):
        proc = subprocess.Popen(
            [sys.executable, "-c", DEFAULT_SIGINT, sys.executable, "-m", "workers.cli", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment(settings),
        )
        try:
            deadline = time.monotonic() + 120
            while not [w async for w in client.list_workflows(QUERY)]:  # the first started
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "no evaluation task started"
                await asyncio.sleep(0.1)
            proc.send_signal(signal.SIGINT)
            out, err = await asyncio.to_thread(proc.communicate, timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 130, err

        deadline = time.monotonic() + 30  # the worker turns each cancel into CANCELED
        while WorkflowExecutionStatus.RUNNING in (found := await statuses(client)).values():
            assert time.monotonic() < deadline, f"still running after Ctrl-C: {found}"
            await asyncio.sleep(0.5)
        await asyncio.sleep(2.0)  # a task that went on waiting for the slot would start here
        made = await made_of(client, next(iter(found)))
    assert not out and "Traceback" not in err, err
    assert list(made) == list(found) and len(found) == 1, made  # the one started before it
    assert set(found.values()) == {WorkflowExecutionStatus.CANCELED}, found
    assert "the 1 started task(s) were cancelled" in err, err


async def made_of(client: Client, first: str) -> dict[str, WorkflowExecutionStatus | None]:
    """The status of each held-out `starter` task's workflow of the evaluation whose workflow
    `first` is, that Temporal has (`describe`: visibility lags, and may miss a late start)."""
    ids = [task.id for task in load_suite("starter", split="heldout")]
    prefix = first.removesuffix(next(i for i in ids if first.endswith(f"-{i}")))
    made = {}
    for workflow in (f"{prefix}{i}" for i in ids):
        try:
            made[workflow] = (await client.get_workflow_handle(workflow).describe()).status
        except RPCError as err:
            assert err.status is RPCStatusCode.NOT_FOUND, err
    return made


class HeldReply(Interceptor):
    """Each start's reply held back a second once the server has made its workflow: the start is
    on its way when the Ctrl-C comes (`made` is set)."""

    def __init__(self) -> None:
        self.made = asyncio.Event()

    def intercept_client(self, next: OutboundInterceptor) -> OutboundInterceptor:
        made = self.made

        class Held(OutboundInterceptor):
            async def start_workflow(self, input: StartWorkflowInput) -> WorkflowHandle[Any, Any]:
                handle = await super().start_workflow(input)
                made.set()
                await asyncio.sleep(1.0)
                return handle

        return Held(next)


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_ctrl_c_while_a_start_is_on_its_way_cancels_its_workflow_too(
    store: ObjectStore, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start the Ctrl-C cut short client-side was made on the server all the same, and no
    handle of it was kept to cancel. The cut is made where `asyncio.run` makes it on SIGINT: the
    evaluation's task is cancelled."""
    held = HeldReply()

    async def connect_held(given: Settings) -> Client:
        return await runtime.connect(given, interceptors=[held])

    monkeypatch.setattr(eval_workflows, "connect", connect_held)
    spec = recorded_run(store)
    tasks = load_suite("starter", split="heldout")[:3]
    client = await connect(settings.temporal.address, settings.temporal.namespace)
    async with running_workers(client, {Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]}}):
        evaluation = asyncio.create_task(
            eval_workflows.evaluate(settings, spec, tasks, "rec-eval-v0--starter-t", 0, 3)
        )
        await asyncio.wait_for(held.made.wait(), 60)
        evaluation.cancel()
        with pytest.raises(asyncio.CancelledError):
            await evaluation
        deadline = time.monotonic() + 30
        while WorkflowExecutionStatus.RUNNING in (found := await statuses(client)).values():
            assert time.monotonic() < deadline, f"still running after Ctrl-C: {found}"
            await asyncio.sleep(0.5)
    assert len(found) == len(tasks), found  # visibility lists each
    assert set(found.values()) == {WorkflowExecutionStatus.CANCELED}, found
