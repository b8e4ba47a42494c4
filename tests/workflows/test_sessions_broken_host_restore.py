"""A restore never goes back to the sandbox worker that lost the sessions while another worker
can take it: AgentTaskWorkflow on the real dev server and real S3, with two sandbox workers'
real session activities in this process (real bwrap sessions, `activities/environment.py`),
the model scripted (tests/workflows/harness.py).

The broken worker's host cannot start a sandbox (its bwrap is gone): it opens sessions (an
open runs no command) but fails every `bash` step with a platform fault. After
`STEP_ATTEMPTS` its sessions are restored; the restore names that worker
(`OpenSessionsRequest.lost_on`), which declines it, and the good worker restores them. Before,
the broken worker (the only one polling `sandbox` then, so deterministically) took its own
restore and lost the sessions again, until `MAX_RESTORES` failed the task. With one worker
only, the worker that failed the step opens them itself once the open has waited the task's
`session_timeout_s`; sessions only lost (closed under the task, as by the TTL) are restored at
once, on any worker: that is no sign of a broken host."""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import WorkflowFailureError, WorkflowHistory
from temporalio.exceptions import ApplicationError

from activities.environment import EnvironmentActivities
from contracts.episode import (
    EnvStepRequest,
    EnvStepResponse,
    OpenSessionsRequest,
    OpenSessionsResponse,
    ToolCall,
)
from contracts.errors import ErrorType
from contracts.names import Activity, Queue
from contracts.rollout import AgentTaskResult, TaskStatus
from contracts.task import AgentTaskInput, SamplingParams
from infra.environments.mounts import remove_tree
from infra.sandbox.local import LocalBackend
from infra.settings import SandboxSettings, Settings, WorkspaceSettings
from infra.storage import ObjectStore
from infra.tasks.workspace import workspace_tasks
from tests.infra.environments.conftest import needs_root, session_root
from tests.workflows.harness import ScriptedModel, connect, running_workers, start
from tests.workflows.replaying import replay
from tests.workflows.test_episodes import SUBMIT, workers
from workflows.agent_task import AgentTaskWorkflow
from workflows.sessions import STEP_ATTEMPTS

pytestmark = [needs_root, pytest.mark.asyncio]
TASK = workspace_tasks()[4]  # workspace-slugify-4: a `functions` check (the local backend's)


class HostWorker:
    """One sandbox worker's real session activities (its own sessions root and queue), with
    what its `open_sessions` and `env_step` did: "opened", "declined" (a restore of sessions
    whose step failed here) or "failed"; each step attempt's error type, or "ok"."""

    def __init__(self, store: ObjectStore, name: str) -> None:
        self.root = session_root()
        settings = Settings(sandbox=SandboxSettings(workspaces=WorkspaceSettings(root=self.root)))
        self.queue = f"sandbox-{name}-{uuid.uuid4().hex[:6]}"
        self.acts = EnvironmentActivities(settings, self.queue, store, LocalBackend(warm=0))
        self.opens: list[str] = []
        self.bwrap = self.acts.env.runner.bwrap
        self.steps: list[str] = []

    def break_host(self, tmp_path: Path) -> None:
        """Its host can start no sandbox from now on (bwrap uninstalled under the worker):
        every command fails with `SandboxNotUp`, a platform fault."""
        self.acts.env.runner.bwrap = str(tmp_path / "bwrap-gone")

    def repair_host(self) -> None:
        self.acts.env.runner.bwrap = self.bwrap

    def queues(self) -> dict[Queue | str, dict[str, Any]]:
        acts = self.acts
        return {
            Queue.SANDBOX: {"activities": [self.open_sessions, acts.verify_episodes]},
            self.queue: {"activities": [self.env_step, acts.close_sessions]},
        }

    @activity.defn(name=Activity.OPEN_SESSIONS.value)
    async def open_sessions(self, req: OpenSessionsRequest) -> OpenSessionsResponse:
        try:
            opened = await self.acts.open_sessions(req)
        except ApplicationError as error:
            declined = error.type == ErrorType.SANDBOX_INFRA and "failed these sessions" in str(
                error
            )
            self.opens.append("declined" if declined else "failed")
            raise
        self.opens.append("opened")
        return opened

    @activity.defn(name=Activity.ENV_STEP.value)
    async def env_step(self, req: EnvStepRequest) -> EnvStepResponse:
        try:
            stepped = await self.acts.env_step(req)
        except ApplicationError as error:
            self.steps.append(error.type or "?")
            raise
        self.steps.append("ok")
        return stepped

    async def close(self) -> None:
        await self.acts.close()
        await self.acts.backend.close()
        root = self.root  # session_root()'s: assert it before removing it
        assert root.name.startswith("tempered-test-sessions-"), root
        assert root.parent == Path(tempfile.gettempdir()), root
        remove_tree(root)


@contextlib.asynccontextmanager
async def host_workers(store: ObjectStore, *names: str):  # type: ignore[no-untyped-def]
    hosts = [HostWorker(store, name) for name in names]
    try:
        yield hosts
    finally:
        for host in hosts:
            await host.close()


def fix_then_submit(sample: int, step: int) -> ToolCall:
    fix = TASK.spec.canonical_solution or ""
    return ToolCall(name="bash", arguments={"command": fix}) if step == 0 else SUBMIT


def task_input(run_id: str, session_timeout_s: float) -> AgentTaskInput:
    return AgentTaskInput(
        task=TASK.spec, run_id=run_id, group_size=2, max_turns=3,
        sampling=SamplingParams(max_new_tokens=4, stop_after_tool_call=True),
        session_timeout_s=session_timeout_s, heartbeat_timeout_s=10.0,
    )  # fmt: skip


async def until(what: str, done: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen in {timeout_s} s")
        await asyncio.sleep(0.1)


def opens_requested(history: WorkflowHistory) -> list[dict[str, Any]]:
    """The `open_sessions` requests the task scheduled, as sent (JSON)."""
    return [
        json.loads(e.activity_task_scheduled_event_attributes.input.payloads[0].data)
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name
        == Activity.OPEN_SESSIONS.value
    ]


async def test_a_broken_hosts_sessions_are_restored_on_another_worker(
    temporal_server, namespace, store: ObjectStore, tmp_path: Path
) -> None:
    """The sessions open on the broken worker (alone on `sandbox` until its restore came to
    it); the good worker joins; the restore lands there and both episodes fix the module."""
    client = await connect(temporal_server.address, namespace)
    for key, data in TASK.objects.items():
        store.put_bytes(key, data)
    model = ScriptedModel(store, fix_then_submit)
    task = task_input(f"broken-host-{uuid.uuid4().hex[:6]}", session_timeout_s=60.0)
    async with (
        host_workers(store, "broken", "good") as (broken, good),
        running_workers(client, {**workers(model, store), **broken.queues()}),
        contextlib.AsyncExitStack() as stack,
    ):
        broken.break_host(tmp_path)
        handle = await start(client, task)
        await until("the restore reaching the broken worker", lambda: len(broken.opens) >= 2, 60)
        other = await connect(temporal_server.address, namespace)  # one worker a client
        await stack.enter_async_context(running_workers(other, good.queues()))
        try:
            result: AgentTaskResult | WorkflowFailureError = await asyncio.wait_for(
                handle.result(), 90
            )
        except WorkflowFailureError as error:  # before: the restores spent on the broken host
            result = error
        status: TaskStatus = await handle.query(AgentTaskWorkflow.status)
    history = await handle.fetch_history()

    print(f"broken: opens {broken.opens}, steps {broken.steps}; good: opens {good.opens}")
    assert broken.opens[0] == "opened" and broken.opens[1:].count("opened") == 0, broken.opens
    assert "declined" in broken.opens and "failed" not in broken.opens
    assert broken.steps == [ErrorType.SANDBOX_INFRA.value] * STEP_ATTEMPTS  # one restore
    assert good.opens == ["opened"] and good.steps == ["ok", "ok"]
    assert isinstance(result, AgentTaskResult), result
    assert result.state == "DONE" and result.solved == [True, True]
    assert result.ends == ["submitted", "submitted"]
    assert [e.session.queue if e.session else None for e in status.samples] == [good.queue] * 2
    for episode in status.samples:
        assert [s.step for s in episode.steps] == [0, 1]  # the failed step recorded once
    first, restore = opens_requested(history)
    assert "lost_on" not in first  # as before: an older worker still takes it
    assert restore["lost_on"] == [broken.queue] and restore["lost_on_wait_s"] == 60.0
    await replay(history, AgentTaskWorkflow)


async def test_the_only_worker_restores_the_sessions_it_failed_after_the_wait(
    temporal_server, namespace, store: ObjectStore, tmp_path: Path
) -> None:
    """One worker, its host broken until it failed the step `STEP_ATTEMPTS` times: it declines
    the restore until the open has waited `session_timeout_s`, then opens them itself."""
    client = await connect(temporal_server.address, namespace)
    for key, data in TASK.objects.items():
        store.put_bytes(key, data)
    async with host_workers(store, "only") as (only,):
        model = ScriptedModel(store, fix_then_submit)
        task = task_input(f"only-{uuid.uuid4().hex[:6]}", session_timeout_s=3.0)
        only.break_host(tmp_path)
        async with running_workers(client, {**workers(model, store), **only.queues()}):
            handle = await start(client, task)
            started = time.monotonic()
            await until("the step failed", lambda: len(only.steps) >= STEP_ATTEMPTS, 60)
            only.repair_host()
            result = await asyncio.wait_for(handle.result(), 60)
            took = time.monotonic() - started
            status: TaskStatus = await handle.query(AgentTaskWorkflow.status)

    print(f"only: opens {only.opens}, steps {only.steps}, the task took {took:.1f} s")
    assert only.opens[0] == only.opens[-1] == "opened" and only.opens.count("opened") == 2
    assert set(only.opens[1:-1]) == {"declined"}, only.opens  # then it waited no longer
    assert only.steps == [ErrorType.SANDBOX_INFRA.value] * STEP_ATTEMPTS + ["ok", "ok"]
    assert result.state == "DONE" and result.solved == [True, True] and took >= 3.0
    assert [e.session.queue if e.session else None for e in status.samples] == [only.queue] * 2


async def test_sessions_only_lost_are_restored_at_once_where_they_were(
    temporal_server, namespace, store: ObjectStore
) -> None:
    """One worker whose sessions are closed under the task (as its TTL would): `SessionLost`
    names no worker, so the restore opens them at once, there (the only worker)."""
    client = await connect(temporal_server.address, namespace)
    for key, data in TASK.objects.items():
        store.put_bytes(key, data)
    async with host_workers(store, "only") as (only,):
        reaped: list[str] = []

        async def reap(step: int) -> None:
            if step == 0 and not reaped:
                reaped.extend(only.acts.host.sessions)
                await only.acts.env.close(reaped)

        model = ScriptedModel(store, fix_then_submit, gate=reap)
        task = task_input(f"lost-{uuid.uuid4().hex[:6]}", session_timeout_s=60.0)
        async with running_workers(client, {**workers(model, store), **only.queues()}):
            handle = await start(client, task)
            result = await asyncio.wait_for(handle.result(), 60)
    history = await handle.fetch_history()

    assert len(reaped) == 2
    assert only.opens == ["opened", "opened"], only.opens  # never declined
    assert only.steps == [ErrorType.SESSION_LOST.value, "ok", "ok"]
    assert result.state == "DONE" and result.solved == [True, True]
    assert all("lost_on" not in request for request in opens_requested(history))
