"""How `tempered eval` (`workers/cli/evaluate.py`) runs its tasks in Temporal: the queues it
needs polled before any starts (`unserved_queues`), and each task's AgentTaskWorkflow,
`concurrency` at a time (`evaluate`). Where one task's workflow fails, the others it started
are cancelled in Temporal and none waits to start (`TaskFailed`): `asyncio.gather` raised at
the first failure and left the others running there, with nothing to end them. So are they
on Ctrl-C (`asyncio.run` cancels `evaluate`), a start on its way included (it is let finish,
then cancelled), before the command exits 130 saying so: they ran on there, waiting for a
model. Cancelled, not terminated: a task closes its workspace sessions as it ends
(`workflows/agent_task.py`). A second Ctrl-C while the cancels go out stops them (asyncio.run's
own rule).

    unserved = await unserved_queues(settings)      # ["tempered-sandbox"]: no worker polls it
    results = await evaluate(settings, spec, tasks, eval_run, version, concurrency=64)
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Any

from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.service import RPCError

from contracts.names import Queue
from contracts.rollout import AgentTaskResult
from contracts.run import TrainingRunInput
from contracts.task import TaskSpec
from infra.settings import Settings
from workers.backlog import queue_backlogs
from workers.runtime import connect
from workflows.agent_task import AgentTaskWorkflow

EVAL_QUEUES = frozenset(q.value for q in Queue) - {Queue.LEARNER.value}
"""The queues an evaluation's tasks go through: the workflows', inference, sandbox, rewards."""


async def unserved_queues(settings: Settings) -> list[str]:
    """The queues an evaluation needs that no worker polls (`DescribeTaskQueue`'s pollers, as
    `tempered status` shows them): with none, `eval` waited for them without a word."""
    backlogs = await queue_backlogs(await connect(settings))
    return [b.queue for b in backlogs if b.queue in EVAL_QUEUES and not b.pollers]


class TaskFailed(Exception):
    """An evaluation task's workflow failed; the others it started were cancelled."""

    def __init__(self, task: str, cause: WorkflowFailureError, cancelled: int):
        why = cause.cause or cause
        super().__init__(
            f"task {task!r} failed ({why}); the {cancelled} other started task(s) were "
            "cancelled where still running; nothing was reported"
        )


async def evaluate(
    settings: Settings,
    spec: TrainingRunInput,
    tasks: list[TaskSpec],
    eval_run: str,
    version: int,
    concurrency: int,
) -> list[AgentTaskResult]:
    """Each task's AgentTaskWorkflow, `concurrency` at a time; TaskFailed at the first that
    fails, once every other one started is cancelled in Temporal and none waits to start
    (`asyncio.gather` raised at the first failure and left the others running there); cancelled
    itself (Ctrl-C), every one started is cancelled there before it re-raises, saying so."""
    client = await connect(settings)
    slots = asyncio.Semaphore(concurrency)
    started: list[WorkflowHandle[Any, AgentTaskResult]] = []
    failed: list[TaskFailed] = []

    async def one(task: TaskSpec) -> AgentTaskResult | None:
        async with slots:
            if failed:
                return None
            starting = asyncio.ensure_future(
                client.start_workflow(
                    AgentTaskWorkflow.run,
                    spec.eval_input(task, eval_run, version),
                    id=f"{eval_run}-{task.id}",
                    task_queue=Queue.AGENT_TASKS.value,
                )
            )
            try:  # a start cut short may still be made on the server: let it end, then cancel
                handle = await asyncio.shield(starting)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):  # one that failed started nothing
                    started.append(await starting)
                raise
            started.append(handle)
            if failed:  # started while another failed: the cancels went out without it
                await _cancel(handle)
            try:
                return await handle.result()
            except WorkflowFailureError as exc:
                if not failed:
                    others = [h for h in started if h is not handle]
                    failed.append(TaskFailed(task.id, exc, len(others)))
                    await asyncio.gather(*(_cancel(h) for h in others))
                return None

    runs = [asyncio.ensure_future(one(task)) for task in tasks]
    try:
        results = await asyncio.gather(*runs)
    except asyncio.CancelledError:  # Ctrl-C: none of them goes on without this command
        await asyncio.gather(*runs, return_exceptions=True)  # the cut gather ended at the first
        await asyncio.gather(*(_cancel(h) for h in started))
        print(
            f"tempered eval: interrupted; the {len(started)} started task(s) were cancelled "
            "where still running; nothing was reported",
            file=sys.stderr,
        )
        raise
    if failed:
        raise failed[0]
    return [result for result in results if result is not None]


async def _cancel(handle: WorkflowHandle[Any, AgentTaskResult]) -> None:
    """Ask Temporal to cancel a task's workflow; one that has ended already is left as it is."""
    with contextlib.suppress(RPCError):
        await handle.cancel()
