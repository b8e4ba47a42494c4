"""The close of a step's sessions on the live worker that failed it `STEP_ATTEMPTS` times, before
their restore elsewhere (`workflows/sessions.py`, `CLOSE_FAILED_PATCH`), is one attempt bounded
by `CLOSE_FAILED_WITHIN`: a close that waits on a session's lock, held by a step attempt still
running there (infra/environments/sessions.py `_remove`; likely where the attempts were spent on
heartbeat timeouts), does not hold the restore past that bound. Before, the close had
`CLOSE_ATTEMPTS` attempts of a 2-minute start-to-close, so the restore waited about 6 minutes in
the very case the close is for. Real dev server and S3; scripted model and sandbox workers
(tests/workflows/harness.py)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest
from temporalio import activity
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory

from activities.heartbeat import heartbeating
from contracts.episode import CloseSessionsRequest, CloseSessionsResponse
from contracts.names import Activity, Queue
from contracts.rollout import AgentTaskResult
from infra.storage import ObjectStore
from tests.workflows.harness import ScriptedModel, ScriptedSandbox, connect, running_workers, start
from tests.workflows.test_episodes import task_input, workers
from tests.workflows.test_sessions62_lost_close import first_attempt
from tests.workflows.test_sessions_infra_steps import BrokenHost, end_of, plan
from workflows.activity_options import activity_options
from workflows.sessions import CLOSE_FAILED_WITHIN, STEP_ATTEMPTS

MARGIN_S = 10.0
"""What the restore may take beyond the bound: workflow tasks, the server's timer."""


class LockedHost(BrokenHost):
    """A worker that fails every step, and whose close waits for a lock that a step attempt
    still running holds, heartbeating meanwhile, as `close_sessions` does."""

    def __init__(self, store: ObjectStore, name: str):
        super().__init__(store, name)
        self.lock = asyncio.Lock()
        self.closes_started = 0

    @activity.defn(name=Activity.CLOSE_SESSIONS.value)
    async def close_sessions(self, req: CloseSessionsRequest) -> CloseSessionsResponse:
        self.closes_started += 1

        async def close() -> int:
            async with self.lock:
                closed = [s for s in req.session_ids if self.sessions.pop(s, None) is not None]
                self.closed += closed
                return len(closed)

        return CloseSessionsResponse(closed=await heartbeating(close()))


def scheduled_sessions(history: WorkflowHistory) -> list[HistoryEvent]:
    """The scheduled events of the session activities (open, close), in order."""
    names = {Activity.OPEN_SESSIONS.value, Activity.CLOSE_SESSIONS.value}
    return [
        e
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name in names
    ]


@pytest.mark.slow  # ~43 s, most of it the 30 s bound waited out; the bound itself is checked in
# make test by the options test below and in test_sessions62_lost_close.py's history
@pytest.mark.asyncio
async def test_a_close_blocked_on_a_held_lock_does_not_hold_the_restore_past_its_bound(
    temporal_server, namespace, store: ObjectStore
) -> None:
    """Worker a opens both sessions, fails their first step `STEP_ATTEMPTS` times, and its
    close waits on a lock the test holds throughout (a step attempt that never ends). The
    restore on b is scheduled within `CLOSE_FAILED_WITHIN` of the close, which had one attempt;
    the task ends on b with both episodes solved."""
    client = await connect(temporal_server.address, namespace)
    locked, good = LockedHost(store, "a"), ScriptedSandbox(store, "b")
    model = ScriptedModel(store, plan)
    task = task_input(store, f"bound-{uuid.uuid4().hex[:6]}", group_size=2, max_turns=3)
    shared, own = locked.workers()[Queue.SANDBOX], locked.workers()[locked.queue]
    await locked.lock.acquire()
    try:
        async with (
            running_workers(client, {**workers(model, store), locked.queue: own}),
            contextlib.AsyncExitStack() as stack,
        ):
            await stack.enter_async_context(running_workers(client, {Queue.SANDBOX: shared}))
            handle = await start(client, task)
            await asyncio.wait_for(first_attempt(locked), 60)
            await stack.aclose()  # a no longer takes opens; its own queue fails steps, closes
            await stack.enter_async_context(running_workers(client, good.workers()))
            bound_s = CLOSE_FAILED_WITHIN.total_seconds()
            result = await end_of(handle, locked, bound_s + 60)
            history = await handle.fetch_history()
    finally:
        locked.lock.release()

    assert isinstance(result, AgentTaskResult), result
    assert result.solved == [True, True]
    assert list(locked.attempts.values()) == [STEP_ATTEMPTS]
    assert locked.closes_started == 1 and not locked.closed  # one attempt, cut at the bound
    assert len(locked.sessions) == 2  # left to the TTL (and the close still under way there)
    events = scheduled_sessions(history)
    queues = [e.activity_task_scheduled_event_attributes.task_queue.name for e in events]
    assert queues == [Queue.SANDBOX.value, locked.queue, Queue.SANDBOX.value, good.queue]
    close, restore = events[1], events[2]
    attributes = close.activity_task_scheduled_event_attributes
    assert attributes.retry_policy.maximum_attempts == 1
    assert attributes.schedule_to_close_timeout.ToTimedelta() == CLOSE_FAILED_WITHIN
    waited = restore.event_time.ToDatetime() - close.event_time.ToDatetime()
    assert waited.total_seconds() <= bound_s + MARGIN_S, waited
    timed_out = [
        e for e in history.events if e.HasField("activity_task_timed_out_event_attributes")
    ]
    assert [e.activity_task_timed_out_event_attributes.scheduled_event_id for e in timed_out] == [
        close.event_id
    ]


def test_within_bounds_the_whole_activity_and_its_start_to_close() -> None:
    bounded = activity_options(Activity.CLOSE_SESSIONS, 5.0, attempts=1, within=CLOSE_FAILED_WITHIN)
    assert bounded["schedule_to_close_timeout"] == CLOSE_FAILED_WITHIN
    assert bounded["start_to_close_timeout"] == CLOSE_FAILED_WITHIN
    assert bounded["retry_policy"].maximum_attempts == 1
    assert "schedule_to_close_timeout" not in activity_options(Activity.CLOSE_SESSIONS, 5.0)
