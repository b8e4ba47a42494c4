"""Run the worker of one task queue (or all of them, for development) until SIGTERM.

    tempered worker sandbox      # one queue, its own process
    tempered worker all          # every queue in one process (development)

Shutdown is graceful: on SIGTERM/SIGINT the worker stops polling, lets in-flight activities
finish for `GRACEFUL_SHUTDOWN` (they are retried elsewhere otherwise), then exits.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import signal
import socket
from datetime import timedelta
from types import ModuleType

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from contracts.names import Queue
from infra.settings import Settings
from workers.plan import WorkerPlan

GRACEFUL_SHUTDOWN = timedelta(seconds=30)
log = logging.getLogger("tempered.worker")

WORKER_MODULES: dict[Queue, str] = {
    Queue.AGENT_TASKS: "workers.agent_tasks",
    Queue.INFERENCE: "workers.inference",
    Queue.SANDBOX: "workers.sandbox",
    Queue.REWARDS: "workers.rewards",
    Queue.LEARNER: "workers.learner",
}


async def connect(settings: Settings, **kwargs: object) -> Client:
    """A client with the pydantic data converter (every client and worker uses it)."""
    return await Client.connect(
        settings.temporal.address,
        namespace=settings.temporal.namespace,
        data_converter=pydantic_data_converter,
        **kwargs,  # type: ignore[arg-type]
    )


def worker_module(queue: Queue) -> ModuleType:
    return importlib.import_module(WORKER_MODULES[queue])


async def build_worker(
    client: Client, queue: Queue, settings: Settings
) -> tuple[Worker, WorkerPlan]:
    """The Worker of `queue`, built from that queue's entry module's plan."""
    plan = worker_module(queue).build(settings)
    worker = Worker(
        client,
        task_queue=queue.value,
        activities=list(plan.activities),
        workflows=list(plan.workflows),
        max_concurrent_activities=plan.max_concurrent_activities,
        graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
        identity=f"{queue.value}@{socket.gethostname()}:{os.getpid()}",
    )
    return worker, plan


async def run_workers(queues: list[Queue], settings: Settings) -> None:
    """Run the workers of `queues` in this process until SIGTERM/SIGINT."""
    telemetry = _telemetry(settings, "+".join(q.value for q in queues))
    options = (
        {"interceptors": telemetry.interceptors(), "runtime": telemetry.temporal_runtime()}
        if telemetry is not None
        else {}
    )
    client = await connect(settings, **options)
    built = [await build_worker(client, q, settings) for q in queues]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runs = [asyncio.create_task(worker.run()) for worker, _ in built]
    for queue in queues:
        log.info("worker ready: queue=%s temporal=%s", queue.value, settings.temporal.address)
    waiter = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([waiter, *runs], return_when=asyncio.FIRST_COMPLETED)
    log.info("worker stopping: queues=%s", ",".join(q.value for q in queues))
    await asyncio.gather(*(worker.shutdown() for worker, _ in built), return_exceptions=True)
    for _, plan in built:
        if plan.on_shutdown is not None:
            await plan.on_shutdown()
    if telemetry is not None:
        telemetry.shutdown()
    for task in done:
        if task is not waiter and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


def _telemetry(settings: Settings, service: str):  # type: ignore[no-untyped-def]
    """OpenTelemetry for this process, when the telemetry module is available."""
    try:
        from infra.telemetry import setup_telemetry
    except ImportError:
        return None
    return setup_telemetry(settings, service)
