"""A workspace step whose sessions live on two sandbox workers, through AgentTaskWorkflow on the
real dev server and real S3 (scripted model and sandbox workers, tests/workflows/harness.py):
when one worker's step fails, or the task is cancelled, the steps still running are cancelled
and have ended before the task closes its sessions (`workflows/sessions.py`, `STOP_PATCH`).
Before, the first error failed the task at once: it closed the other worker's sessions while
that worker's step still ran in them, and the step ran on after the task had failed."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

from contracts.episode import (
    CloseSessionsRequest,
    CloseSessionsResponse,
    EnvStepRequest,
    EnvStepResponse,
    OpenSessionsRequest,
    OpenSessionsResponse,
)
from contracts.errors import ErrorType, fail
from contracts.names import Activity, Queue
from infra.storage import ObjectStore
from tests.workflows.harness import ScriptedModel, ScriptedSandbox, connect, running_workers, start
from tests.workflows.replaying import replay
from tests.workflows.test_episodes import task_input, workers, write
from workflows.agent_task import AgentTaskWorkflow
from workflows.sessions import STOP_PATCH

HISTORY = Path(__file__).parent / "histories" / "agent_task_workspace_stopped.json"
STEP = 1
"""The step at which worker a's step fails (or the task is cancelled) while b's runs."""
HANG_S = 20.0
"""How long a hanging step waits for its cancel before it ends on its own."""


async def hang(log: list[str], name: str, started: asyncio.Event) -> None:
    """Heartbeat (so a cancel reaches the activity) until cancelled, or for `HANG_S`."""
    log.append(f"{name} started")
    started.set()
    try:
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            activity.heartbeat()
            await asyncio.sleep(0.2)
    except asyncio.CancelledError:
        log.append(f"{name} cancelled")
        raise
    finally:
        log.append(f"{name} ended")


class Worker(ScriptedSandbox):
    """A sandbox worker whose step `STEP` fails once `fails_after` is set, or loses its
    sessions (once), or else hangs; `log` is shared by the workers."""

    def __init__(
        self,
        store: ObjectStore,
        name: str,
        log: list[str],
        fails_after: asyncio.Event | None = None,
        loses: bool = False,
    ):
        super().__init__(store, name)
        self.name, self.log, self.fails_after, self.loses = name, log, fails_after, loses
        self.hanging = asyncio.Event()

    @activity.defn(name=Activity.ENV_STEP.value)
    async def env_step(self, req: EnvStepRequest) -> EnvStepResponse:
        if req.step == STEP and self.fails_after is not None:
            await self.fails_after.wait()
            self.log.append(f"{self.name} failed")
            raise fail(ErrorType.INVALID_INPUT, f"worker {self.name} cannot run step {STEP}")
        if req.step == STEP and self.loses:
            self.loses = False
            self.sessions.clear()  # e.g. reaped: the step is restored elsewhere
            raise fail(ErrorType.SESSION_LOST, f"worker {self.name} lost its sessions")
        if req.step == STEP:
            await hang(self.log, self.name, self.hanging)
        return await super().env_step(req)

    @activity.defn(name=Activity.CLOSE_SESSIONS.value)
    async def close_sessions(self, req: CloseSessionsRequest) -> CloseSessionsResponse:
        self.log.append(f"{self.name} closed")
        return await super().close_sessions(req)


class Split:
    """`open_sessions` on `sandbox` that opens sample 0's session on worker a, the others' on b
    (as a restore of some of a group's sessions leaves them); a restore hangs first."""

    def __init__(self, a: Worker, b: Worker):
        self.a, self.b = a, b
        self.restoring = asyncio.Event()

    @activity.defn(name=Activity.OPEN_SESSIONS.value)
    async def open_sessions(self, req: OpenSessionsRequest) -> OpenSessionsResponse:
        if req.snapshots:
            await hang(self.a.log, "restore", self.restoring)
        sessions = {}
        for worker, samples in ((self.a, [0]), (self.b, [s for s in req.samples if s])):
            if part := [s for s in samples if s in req.samples]:
                opened = await worker.open_sessions(req.model_copy(update={"samples": part}))
                sessions.update(opened.sessions)
        return OpenSessionsResponse(sessions=sessions)


def sandboxes(split: Split) -> dict[Queue | str, dict[str, Any]]:
    a, b = split.a, split.b
    return {
        Queue.SANDBOX: {"activities": [split.open_sessions, a.verify_episodes]},
        a.queue: {"activities": [a.env_step, a.close_sessions]},
        b.queue: {"activities": [b.env_step, b.close_sessions]},
    }


FAILS, RESTORING, CANCELLED = "a step fails", "a step fails while b restores", "task cancelled"


@pytest.mark.parametrize("stop", [FAILS, RESTORING, CANCELLED])
@pytest.mark.asyncio
async def test_a_failed_or_cancelled_step_stops_the_other_steps_before_closing(
    temporal_server, namespace, store: ObjectStore, stop: str
) -> None:
    """Step 1 runs on a and on b at once. FAILS: a's fails once b's is running; RESTORING:
    once b, which lost its sessions, is restoring them; CANCELLED: both hang, and the test
    cancels the task. Every step (or restore) still running was cancelled and ended before
    the first close, the task fails with a's error (or ends cancelled), no session is left."""
    log: list[str] = []
    b = Worker(store, "b", log, loses=stop == RESTORING)
    a = Worker(store, "a", log)
    split = Split(a, b)
    a.fails_after = {FAILS: b.hanging, RESTORING: split.restoring}.get(stop)
    client = await connect(temporal_server.address, namespace)
    model = ScriptedModel(store, lambda sample, step: write(f"f{step}.txt", f"{sample}"))
    task = task_input(store, f"stop-{uuid.uuid4().hex[:6]}", group_size=3, max_turns=4)
    async with running_workers(client, {**workers(model, store), **sandboxes(split)}):
        handle = await start(client, task)
        if stop == CANCELLED:
            await asyncio.wait_for(asyncio.gather(a.hanging.wait(), b.hanging.wait()), 60)
            await handle.cancel()
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), 60)
        history = await handle.fetch_history()

    hung = {FAILS: ["b"], RESTORING: ["restore"], CANCELLED: ["a", "b"]}[stop]
    closes = [i for i, line in enumerate(log) if line.endswith("closed")]
    assert closes and not a.sessions and not b.sessions, log
    for name in hung:  # cancelled, and ended, before any session was closed
        assert log.index(f"{name} cancelled") < log.index(f"{name} ended") < closes[0], log
    cause = failed.value.cause
    if stop != CANCELLED:
        assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError)
        assert cause.cause.type == ErrorType.INVALID_INPUT and "worker a" in str(cause.cause)
    else:
        assert isinstance(cause, CancelledError)
    patches = [e for e in history.events if e.HasField("marker_recorded_event_attributes")]
    assert any(STOP_PATCH.encode() in e.SerializeToString() for e in patches)  # its marker
    await replay(history, AgentTaskWorkflow)
    if stop == FAILS and os.environ.get("TEMPERED_RECORD_HISTORIES"):
        HISTORY.write_text(history.to_json())  # test_replay.py replays it
