"""A cancelled activity attempt in `tempered status`' figures (through the real interceptor, a
real Temporal dev server and the JSONL files): a heartbeat timeout or a cancel the workflow asked
for is counted as cancelled and sets the last error, and no cancelled attempt counts toward
done/s; a worker shutdown's cancels are none of those."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError
from temporalio.worker import Worker

from infra import telemetry as tm
from infra.settings import Settings
from infra.telemetry_figures import worker_figures
from tests.fixtures.temporal import TemporalServer

ONCE = RetryPolicy(maximum_attempts=1)
_STARTED: list[bool] = []


@activity.defn
async def _stalls() -> str:
    """Heartbeats, stops for longer than its heartbeat timeout (a blocked loop, lost heartbeats),
    then heartbeats again: the answer tells it that it timed out."""
    activity.heartbeat()
    await asyncio.sleep(4)  # 4 heartbeat timeouts: a server's late timer still fires
    while True:
        activity.heartbeat()
        await asyncio.sleep(0.2)


@activity.defn
async def _waits_for_its_cancel() -> str:
    """Heartbeats until cancelled (the cancel comes with a heartbeat's answer)."""
    _STARTED.append(True)
    while True:
        activity.heartbeat()
        await asyncio.sleep(0.2)


@workflow.defn(sandboxed=False)
class _TimesOut:
    @workflow.run
    async def run(self) -> str:
        try:
            await workflow.execute_activity(
                _stalls,
                start_to_close_timeout=timedelta(seconds=60),
                heartbeat_timeout=timedelta(seconds=1),
                retry_policy=ONCE,
            )
        except ActivityError:
            await workflow.sleep(5)  # the attempt learns it timed out at its next heartbeat
            return "timed out"
        return "unexpected success"


@workflow.defn(sandboxed=False)
class _CancelsIt:
    @workflow.run
    async def run(self) -> str:
        handle = workflow.start_activity(
            _waits_for_its_cancel,
            start_to_close_timeout=timedelta(seconds=60),
            heartbeat_timeout=timedelta(seconds=5),
            retry_policy=ONCE,
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
        await workflow.sleep(1)
        handle.cancel()
        try:
            await handle
        except ActivityError:
            return "cancelled"
        return "unexpected success"


async def _run(server: TemporalServer, namespace: str, telemetry: tm.Telemetry, flow: Any) -> str:
    client = await Client.connect(
        server.address, namespace=namespace, interceptors=telemetry.interceptors()
    )
    queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client, task_queue=queue, workflows=[flow], activities=[_stalls, _waits_for_its_cancel]
    ):
        return str(
            await client.execute_workflow(
                flow.run, id=f"cancelled-{uuid.uuid4()}", task_queue=queue
            )
        )


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("flow", "outcome", "said"),
    [
        (_TimesOut, "timed out", ("_stalls: cancelled (", "timed out")),
        (_CancelsIt, "cancelled", ("_waits_for_its_cancel: cancelled (", "asked by its workflow")),
    ],
)
async def test_a_cancelled_attempt_is_counted_and_is_the_last_error(
    tmp_path: Path,
    temporal_server: TemporalServer,
    namespace: str,
    flow: Any,
    outcome: str,
    said: tuple[str, str],
) -> None:
    """`said`: how the last error begins, and why it says the attempt was cancelled (a timeout
    reaches the worker as "not found" or as "timed out", as the server says)."""
    settings = Settings(home=tmp_path)
    telemetry = tm.setup_telemetry(settings, "sandbox", export_interval_s=60)
    started = time.time()
    try:
        assert await _run(temporal_server, namespace, telemetry, flow) == outcome
        telemetry.flush()
    finally:
        telemetry.shutdown()
    [figures] = tm.read_live_figures(settings).values()
    [queue] = figures.queues.values()
    assert (queue.in_flight, queue.succeeded, queue.failed, queue.cancelled) == (0, 0, 0, 1)
    assert queue.last_error_at is not None and started <= queue.last_error_at <= time.time()
    assert queue.last_error is not None and queue.last_error.startswith(said[0]), queue.last_error
    assert said[1] in queue.last_error, queue.last_error


@pytest.mark.asyncio
async def test_a_worker_shutdowns_cancel_is_no_error(
    tmp_path: Path, temporal_server: TemporalServer, namespace: str
) -> None:
    settings = Settings(home=tmp_path)
    telemetry = tm.setup_telemetry(settings, "sandbox", export_interval_s=60)
    try:
        client = await Client.connect(
            temporal_server.address, namespace=namespace, interceptors=telemetry.interceptors()
        )
        queue = f"sandbox-{uuid.uuid4().hex[:8]}"
        worker = Worker(client, task_queue=queue, activities=[_waits_for_its_cancel])
        running = asyncio.ensure_future(worker.run())
        flows = f"{queue}-flows"  # the workflow elsewhere: only the activity's worker stops
        async with Worker(client, task_queue=flows, workflows=[_StartsOnQueue]):
            _STARTED.clear()
            await client.start_workflow(
                _StartsOnQueue.run, queue, id=f"starts-{uuid.uuid4()}", task_queue=flows
            )
            deadline = time.monotonic() + 20
            while not _STARTED and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            assert _STARTED, "the activity never started"
            await worker.shutdown()  # no grace: the attempt in flight is cancelled
            await running
        telemetry.flush()
    finally:
        telemetry.shutdown()
    [figures] = tm.read_live_figures(settings).values()
    mine = figures.queues[queue]
    assert (mine.in_flight, mine.succeeded, mine.failed, mine.cancelled) == (0, 0, 0, 0)
    assert mine.last_error_at is None and mine.last_error is None


@workflow.defn(sandboxed=False)
class _StartsOnQueue:
    @workflow.run
    async def run(self, queue: str) -> str:
        await workflow.execute_activity(
            _waits_for_its_cancel,
            task_queue=queue,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=ONCE,
        )
        return "done"


def test_cancelled_attempts_are_not_done_per_second() -> None:
    """The reviewer's figures: 10 attempts done, then 10 cancelled in 20 s: nothing done."""
    now = time.time()

    def snapshot(ts: float, ok: int, cancelled: int) -> dict:
        counts = (("ok", ok), ("error", 0), ("cancelled", cancelled))
        points = [
            {
                "name": "tempered.activity.attempts",
                "attrs": {"queue": "sandbox", "outcome": outcome},
                "value": value,
            }
            for outcome, value in counts
        ]
        return {"kind": "metrics", "ts": ts, "interval_s": 10, "points": points}

    records = [snapshot(now - 20, 10, 0), snapshot(now - 10, 10, 5), snapshot(now, 10, 10)]
    figures = worker_figures("sandbox", os.getpid(), True, records)
    assert figures is not None
    queue = figures.queues["sandbox"]
    assert (queue.succeeded, queue.failed, queue.cancelled, queue.per_s) == (10, 0, 10, 0.0)
