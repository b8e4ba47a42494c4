"""Run the worker of one task queue (or all of them, for development) until SIGTERM.

    tempered worker sandbox      # one queue, its own process
    tempered worker all          # every queue in one process (development)

`BUILDERS` maps each queue to its entry module's `build(settings) -> WorkerPlan`. The workflow
worker is versioned (`workers.versioning`: a pinned Worker Deployment build, made current once
it polls). The process's health files (`workers.health`: ready once every Worker polls, alive
while its event loop runs) are what the Helm chart's probes read. Shutdown is graceful: on
SIGTERM/SIGINT the worker stops polling, lets in-flight activities finish for its plan's
`drain_s` (they are retried elsewhere otherwise; the SDK then cancels the rest), closes each
plan and then telemetry, each whatever the others did (`close_each`), then exits. How long all
that may take is `workers.background.STOP_MARGIN_S` beyond the drain. A connect that reaches no
Temporal is `TemporalUnreachable`, which the command line turns into one line naming the address.
Before it connects, a process one of whose plans `uses_store` lists the bucket once with its
credentials (`infra.storage_checks.check_access`, waiting up to `STORE_WAIT_S` for a store that
does not answer yet): refused credentials, or a store that never answered, end it in one line
(the endpoint, the access key id, the settings to set), not a ready worker whose every S3
activity fails.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

from temporalio.client import Client, Interceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.worker import Worker

from contracts.names import Queue
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.storage_checks import check_access
from infra.telemetry import setup_telemetry
from workers import agent_tasks, inference, learner, rewards, sandbox
from workers.health import Health
from workers.identity import worker_identity
from workers.plan import WorkerPlan, close_each
from workers.versioning import deployment_config, promote_in_background

log = logging.getLogger("tempered.worker")
SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""What stops the workers (gracefully: their drain)."""
STORE_WAIT_S = 60.0
"""How long a worker's start retries an object store that does not answer (one still starting,
as SeaweedFS is for a while after a restart) before it gives up."""
CONNECT_FAILED = "Failed client connect"
"""How the SDK's error of a connect that reached no Temporal begins (refused, silent, not gRPC)."""

BUILDERS: dict[Queue, Callable[[Settings], WorkerPlan]] = {
    Queue.AGENT_TASKS: agent_tasks.build,
    Queue.INFERENCE: inference.build,
    Queue.SANDBOX: sandbox.build,
    Queue.REWARDS: rewards.build,
    Queue.LEARNER: learner.build,
}


class TemporalUnreachable(RuntimeError):
    """No Temporal frontend answered at `address`: the SDK's "Failed client connect: …" (its
    text, which names the address only where the TCP connect itself failed), with the address
    the settings gave. A RuntimeError still, as the SDK's own, for the callers that catch it."""

    def __init__(self, address: str, said: str):
        super().__init__(said)
        self.address = address


async def connect(
    settings: Settings, interceptors: Sequence[Interceptor] = (), runtime: Runtime | None = None
) -> Client:
    """A client with the pydantic data converter (every client and worker uses it); a failed
    connect is `TemporalUnreachable`."""
    try:
        return await Client.connect(
            settings.temporal.address,
            namespace=settings.temporal.namespace,
            data_converter=pydantic_data_converter,
            interceptors=interceptors,
            runtime=runtime,
        )
    except RuntimeError as exc:
        if not str(exc).startswith(CONNECT_FAILED):
            raise
        raise TemporalUnreachable(settings.temporal.address, str(exc)) from exc


@functools.cache
def quiet_runtime() -> Runtime:
    """The SDK runtime of a command's own client, whose core logs errors only: its warnings
    are a call's retries ("gRPC call … retried 5 times … tcp connect error"), a minute of them
    before the call fails, which the command then says in its own words."""
    quiet = TelemetryFilter(core_level="ERROR", other_level="ERROR")
    return Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(filter=quiet)))


async def build_worker(
    client: Client, queue: Queue, settings: Settings, plan: WorkerPlan | None = None
) -> tuple[Worker, WorkerPlan]:
    """The Worker of `queue`, built from `plan` (default: that queue's entry module's; a
    workflow worker is made its deployment's current build in the background, once it polls)."""
    plan = BUILDERS[queue](settings) if plan is None else plan
    versioning = deployment_config(settings, plan)
    worker = Worker(
        client,
        task_queue=queue.value,
        activities=list(plan.activities),
        workflows=list(plan.workflows),
        max_concurrent_activities=plan.max_concurrent_activities,
        graceful_shutdown_timeout=timedelta(seconds=plan.drain_s),
        identity=worker_identity(queue.value),
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
        identity=worker_identity(plan.own_queue),
    )


async def check_store(plans: list[WorkerPlan], settings: Settings) -> None:
    """Where a plan `uses_store`: `check_access` of the settings' store, waiting up to
    `STORE_WAIT_S`."""
    if any(plan.uses_store for plan in plans):
        await asyncio.to_thread(check_access, ObjectStore.from_settings(settings), STORE_WAIT_S)


def closes(
    queues: list[Queue], plans: list[WorkerPlan]
) -> list[tuple[str, Callable[[], Awaitable[None]] | None]]:
    """Each plan's close, for `close_each`."""
    return [(f"closing {q.value}", plan.on_shutdown) for q, plan in zip(queues, plans, strict=True)]


async def run_workers(queues: list[Queue], settings: Settings) -> None:
    """Run the workers of `queues` in this process until SIGTERM/SIGINT, with their health
    files (`workers.health`); at the end close each plan, then telemetry, each whatever the
    others did."""
    name = "+".join(q.value for q in queues)
    health = Health(settings.home, name)
    health.clear()  # a dead worker's files never say this one is ready
    plans = [BUILDERS[q](settings) for q in queues]
    try:  # a store or a Temporal not there yet (a pod restarted until they are): plans closed
        await check_store(plans, settings)
        telemetry = setup_telemetry(settings, name)
        client = await connect(settings, telemetry.interceptors(), telemetry.temporal_runtime())
        built = [
            await build_worker(client, q, settings, plan)
            for q, plan in zip(queues, plans, strict=True)
        ]
    except BaseException:
        await close_each(closes(queues, plans))
        raise
    workers = [worker for worker, _ in built]
    workers += [own_queue_worker(client, plan) for _, plan in built if plan.own_queue]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in SIGNALS:
        loop.add_signal_handler(sig, stop.set)

    def ready() -> None:
        for worker in workers:
            queue = worker.task_queue
            log.info("worker ready: queue=%s temporal=%s", queue, settings.temporal.address)

    runs = [asyncio.create_task(worker.run()) for worker in workers]
    beating = asyncio.create_task(health.serve(workers, ready))
    waiter = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([waiter, *runs], return_when=asyncio.FIRST_COMPLETED)
        log.info("worker stopping: queues=%s", ",".join(q.value for q in queues))
        health.not_ready()  # alive still: it drains, and its loop runs
        await asyncio.gather(*(worker.shutdown() for worker in workers), return_exceptions=True)
        await close_each([*closes(queues, plans), ("telemetry's shutdown", telemetry.shutdown)])
    finally:
        beating.cancel()
        for sig in SIGNALS:
            loop.remove_signal_handler(sig)
        health.clear()
    for task in done:
        if task is not waiter and (error := task.exception()) is not None:
            raise error
