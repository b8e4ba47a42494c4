"""Task-queue backlogs, as Temporal reports them: what `tempered status` and the `tempered train`
progress line show, and what the Helm chart's autoscalers scale each worker Deployment on.

    figures = await queue_backlogs(client)     # one QueueBacklog per Tempered task queue

A queue's backlog is its tasks waiting for a worker (`DescribeTaskQueue` with `report_stats`):
workflow tasks for agent-tasks (the workflow worker), activity tasks for the others. Rates are
tasks per second over the server's recent window; all figures are approximate. The same call lists
the queue's pollers (`queue_pollers`): the workers that polled it lately, which `tempered train`
asks before starting a worker of its own (`workers.background.ensure_workers`).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from pydantic import BaseModel, Field
from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    DescribeTaskQueueResponse,
)
from temporalio.client import Client

from contracts.names import ACTIVITY_QUEUE, Queue

WORKFLOW_QUEUES = frozenset(Queue) - frozenset(ACTIVITY_QUEUE.values())
"""Queues whose backlog is of workflow tasks (the others': activity tasks)."""


class QueueBacklog(BaseModel):
    """One task queue's waiting work."""

    queue: str
    kind: str = Field(description="workflow or activity: which tasks wait.")
    backlog: int = Field(ge=0, description="Tasks waiting for a worker.")
    oldest_s: float = Field(ge=0, description="Age of the oldest waiting task, seconds.")
    added_per_s: float = Field(ge=0)
    dispatched_per_s: float = Field(ge=0)
    pollers: int = Field(ge=0, description="Workers polling it lately.")


class Poller(BaseModel):
    """A worker that polled a queue lately, as Temporal lists it (it keeps one listed a while
    after its last poll, whether or not its process still runs)."""

    identity: str = Field(description="The worker's identity (`workers.runtime`: queue@host:pid).")
    last_access: datetime = Field(description="When it last polled, UTC.")


async def _describe(client: Client, queue: Queue, stats: bool) -> DescribeTaskQueueResponse:
    """`DescribeTaskQueue` of `queue`'s tasks: workflow tasks for agent-tasks, else activity."""
    kind = (
        TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW
        if queue in WORKFLOW_QUEUES
        else TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY
    )
    return await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=queue.value, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
            task_queue_type=kind,
            report_stats=stats,
        )
    )


async def queue_pollers(client: Client, queue: Queue) -> list[Poller]:
    """The workers that polled `queue` lately (a worker's tasks of `_describe`'s kind)."""
    described = await _describe(client, queue, stats=False)
    return [
        Poller(
            identity=poller.identity,
            last_access=poller.last_access_time.ToDatetime(tzinfo=UTC),
        )
        for poller in described.pollers
    ]


async def queue_backlog(client: Client, queue: Queue) -> QueueBacklog:
    workflows = queue in WORKFLOW_QUEUES
    described = await _describe(client, queue, stats=True)
    stats = described.stats
    age = stats.approximate_backlog_age
    return QueueBacklog(
        queue=queue.value,
        kind="workflow" if workflows else "activity",
        backlog=stats.approximate_backlog_count,
        oldest_s=age.seconds + age.nanos / 1e9,
        added_per_s=stats.tasks_add_rate,
        dispatched_per_s=stats.tasks_dispatch_rate,
        pollers=len(described.pollers),
    )


async def queue_backlogs(client: Client) -> list[QueueBacklog]:
    """Every Tempered task queue's backlog, in `Queue` order."""
    return list(await asyncio.gather(*(queue_backlog(client, queue) for queue in Queue)))


def backlog_text(backlogs: list[QueueBacklog]) -> str:
    """`agent-tasks 0, inference 12 (3 s), sandbox 0, …`: waiting tasks (oldest) per queue."""
    return ", ".join(
        f"{b.queue} {b.backlog}" + (f" ({b.oldest_s:.0f} s)" if b.backlog else "") for b in backlogs
    )
