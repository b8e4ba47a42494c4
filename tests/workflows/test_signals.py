"""`workflows.signals.signal_run` on the time-skipping test server: a signal that finds no run is
retried until the target appears (as a run continuing as new reappears), given up when the
caller says the target is gone, and raised once the retries are spent."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from contracts.names import Signal
from tests.fixtures.temporal import time_skipping_server
from workflows.signals import RETRY_DELAYS_S, signal_run

QUEUE = "signals-test"


@workflow.defn(sandboxed=False)
class Sender:
    @workflow.run
    async def run(self, target: str, gone: bool) -> bool:
        return await signal_run(target, Signal.ABORT, ["hello"], gone=lambda: gone)


@workflow.defn(sandboxed=False)
class Receiver:
    def __init__(self) -> None:
        self._got: str | None = None

    @workflow.signal(name=Signal.ABORT)
    def abort(self, value: str) -> None:
        self._got = value

    @workflow.run
    async def run(self) -> str:
        await workflow.wait_condition(lambda: self._got is not None)
        assert self._got is not None
        return self._got


@contextlib.asynccontextmanager
async def senders_and_receivers() -> AsyncIterator[WorkflowEnvironment]:
    async with (
        time_skipping_server() as env,
        Worker(env.client, task_queue=QUEUE, workflows=[Sender, Receiver]),
    ):
        yield env


async def events(client: Client, workflow_id: str, kind: int) -> int:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return sum(1 for e in history.events if e.event_type == kind)


@pytest.mark.asyncio
async def test_a_signal_waits_for_its_target_to_appear() -> None:
    async with senders_and_receivers() as env:
        target, sender = f"target-{uuid.uuid4()}", f"sender-{uuid.uuid4()}"
        with env.auto_time_skipping_disabled():
            handle = await env.client.start_workflow(
                Sender.run, args=[target, False], id=sender, task_queue=QUEUE
            )
            async with asyncio.timeout(30):  # the first signal failed: the sender waits to retry
                while not await events(env.client, sender, EventType.EVENT_TYPE_TIMER_STARTED):
                    await asyncio.sleep(0.1)
            receiver = await env.client.start_workflow(Receiver.run, id=target, task_queue=QUEUE)
            await env.sleep(RETRY_DELAYS_S[0] + 1)
            assert await handle.result() is True
            assert await receiver.result() == "hello"
        failed = EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED
        assert await events(env.client, sender, failed) == 1


@pytest.mark.asyncio
async def test_a_signal_to_a_target_gone_for_good_gives_up_or_fails() -> None:
    async with senders_and_receivers() as env:
        gone = await env.client.execute_workflow(
            Sender.run, args=["nobody", True], id=f"gone-{uuid.uuid4()}", task_queue=QUEUE
        )
        assert gone is False  # the caller knew: no retry
        sender = f"sender-{uuid.uuid4()}"
        with pytest.raises(WorkflowFailureError):
            await env.client.execute_workflow(
                Sender.run, args=["nobody", False], id=sender, task_queue=QUEUE
            )
        failed = EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_FAILED
        assert await events(env.client, sender, failed) == len(RETRY_DELAYS_S) + 1
