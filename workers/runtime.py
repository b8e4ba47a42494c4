"""Run the worker of one task queue (or all of them, for development) until SIGTERM.

    tempered worker sandbox      # one queue, its own process
    tempered worker all          # every queue in one process (development)

`BUILDERS` maps each queue to its entry module's `build(settings) -> WorkerPlan`. The workflow
worker is versioned (`workers.versioning`: a pinned Worker Deployment build, made current once
it polls). Shutdown is graceful: on SIGTERM/SIGINT the worker stops polling, lets in-flight
activities finish for its plan's `drain_s` (they are retried elsewhere otherwise), then exits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from temporalio.client import Client, Interceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.worker import Worker

from contracts.names import Queue
from infra.settings import Settings
from infra.telemetry import setup_telemetry
from workers import agent_tasks, inference, learner, rewards, sandbox
from workers.plan import WorkerPlan
from workers.versioning import deployment_config, promote_in_background

log = logging.getLogger("tempered.worker")

BUILDERS: dict[Queue, Callable[[Settings], WorkerPlan]] = {
    Queue.AGENT_TASKS: agent_tasks.build,
    Queue.INFERENCE: inference.build,
    Queue.SANDBOX: sandbox.build,
    Queue.REWARDS: rewards.build,
    Queue.LEARNER: learner.build,
}


async def connect(
    settings: Settings, interceptors: Sequence[Interceptor] = (), runtime: Runtime | None = None
) -> Client:
    """A client with the pydantic data converter (every client and worker uses it)."""
    return await Client.connect(
        settings.temporal.address,
        namespace=settings.temporal.namespace,
        data_converter=pydantic_data_converter,
        interceptors=interceptors,
        runtime=runtime,
    )


async def build_worker(
    client: Client, queue: Queue, settings: Settings
) -> tuple[Worker, WorkerPlan]:
    """The Worker of `queue`, built from that queue's entry module's plan (a workflow worker
    is made its deployment's current build in the background, once it polls)."""
    plan = BUILDERS[queue](settings)
    versioning = deployment_config(settings, plan)
    worker = Worker(
        client,
        task_queue=queue.value,
        activities=list(plan.activities),
        workflows=list(plan.workflows),
        max_concurrent_activities=plan.max_concurrent_activities,
        graceful_shutdown_timeout=timedelta(seconds=plan.drain_s),
        identity=f"{queue.value}@{socket.gethostname()}:{os.getpid()}",
        deployment_config=versioning,
        **throttle(plan),
    )
    promote_in_background(client, settings, versioning)
    return worker, plan


def throttle(plan: WorkerPlan) -> dict[str, Any]:
    """The Worker's heartbeat throttle, where the plan sets one."""
    if plan.heartbeat_every_s is None:
        return {}
    every = timedelta(seconds=plan.heartbeat_every_s)
    return {"max_heartbeat_throttle_interval": every, "default_heartbeat_throttle_interval": every}


def own_queue_worker(client: Client, plan: WorkerPlan) -> Worker:
    """The Worker of a plan's own queue (same activity instances, this process only)."""
    assert plan.own_queue is not None
    return Worker(
        client,
        task_queue=plan.own_queue,
        activities=list(plan.own_queue_activities),
        max_concurrent_activities=plan.own_queue_max_concurrent,
        graceful_shutdown_timeout=timedelta(seconds=plan.drain_s),
        identity=f"{plan.own_queue}@{socket.gethostname()}:{os.getpid()}",
    )


async def run_workers(queues: list[Queue], settings: Settings) -> None:
    """Run the workers of `queues` in this process until SIGTERM/SIGINT."""
    telemetry = setup_telemetry(settings, "+".join(q.value for q in queues))
    client = await connect(settings, telemetry.interceptors(), telemetry.temporal_runtime())
    built = [await build_worker(client, q, settings) for q in queues]
    workers = [worker for worker, _ in built]
    workers += [own_queue_worker(client, plan) for _, plan in built if plan.own_queue]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runs = [asyncio.create_task(worker.run()) for worker in workers]
    for worker in workers:
        queue = worker.task_queue
        log.info("worker ready: queue=%s temporal=%s", queue, settings.temporal.address)
    waiter = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([waiter, *runs], return_when=asyncio.FIRST_COMPLETED)
    log.info("worker stopping: queues=%s", ",".join(q.value for q in queues))
    await asyncio.gather(*(worker.shutdown() for worker in workers), return_exceptions=True)
    for _, plan in built:
        if plan.on_shutdown is not None:
            await plan.on_shutdown()
    telemetry.shutdown()
    for task in done:
        if task is not waiter and (error := task.exception()) is not None:
            raise error
