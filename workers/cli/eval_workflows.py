"""How `tempered eval` (`workers/cli/evaluate.py`) runs its tasks in Temporal: the queues it
needs polled before any starts (`unserved_queues`), and each task's AgentTaskWorkflow,
`concurrency` at a time (`evaluate`).

Whatever stops the evaluation before every task is done -- a task's workflow that failed
(`TaskFailed`), Ctrl-C (`asyncio.run` cancels `evaluate`), or any other error (an `RPCError`
once Temporal was unreachable past the client's retries) -- none waits to start any more, a
start on its way is let finish, and every workflow started is cancelled in Temporal before the
error goes on: they ran on there, waiting for a model, with nothing to end them (`asyncio.gather`
raised at the first error and left them; only a failed task and Ctrl-C cancelled them). One line
says how many were cancelled (the cancels that went through: Temporal may not be reached) and
names any it could not cancel. A start that failed, or was cut short and then failed, may have
been made on the server all the same (its response lost: DEADLINE_EXCEEDED, or the SDK's retry
met the workflow it made): it is cancelled by its workflow id (fixed, `<eval run>-<task>`;
NOT_FOUND: nothing was made), or named among those that could not be. Cancelled, not terminated: a task closes its workspace sessions
as it ends (`workflows/agent_task.py`). A second Ctrl-C while the cancels go out stops them
(asyncio.run's own rule).

    unserved = await unserved_queues(settings)      # ["tempered-sandbox"]: no worker polls it
    results = await evaluate(settings, spec, tasks, eval_run, version, concurrency=64)
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, NamedTuple

from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from contracts.names import Queue
from contracts.rollout import AgentTaskResult
from contracts.run import TrainingRunInput
from contracts.task import TaskSpec
from infra.aio import all_or_cancel
from infra.settings import Settings
from workers.backlog import queue_backlogs
from workers.cli.errors import describe
from workers.runtime import connect
from workflows.agent_task import AgentTaskWorkflow

EVAL_QUEUES = frozenset(q.value for q in Queue) - {Queue.LEARNER.value}
"""The queues an evaluation's tasks go through: the workflows', inference, sandbox, rewards."""

Handle = WorkflowHandle[Any, AgentTaskResult]


async def unserved_queues(settings: Settings) -> list[str]:
    """The queues an evaluation needs that no worker polls (`DescribeTaskQueue`'s pollers, as
    `tempered status` shows them): with none, `eval` waited for them without a word."""
    backlogs = await queue_backlogs(await connect(settings))
    return [b.queue for b in backlogs if b.queue in EVAL_QUEUES and not b.pollers]


class TaskFailed(Exception):
    """An evaluation task's workflow failed; the others it started were cancelled (`cleared`
    says how many, once their cancels are done)."""

    def __init__(self, task: str, cause: WorkflowFailureError):
        super().__init__(task, cause)
        self.task, self.why = task, cause.cause or cause
        self.cleared = Cleared(0, [])

    def __str__(self) -> str:
        return f"task {self.task!r} failed ({self.why}); the {self.cleared.said('other ')}"


class Cleared(NamedTuple):
    """The started workflows an error's clean-up cancelled (`cancelled`: the cancels that went
    through; one ended already is not counted) and those whose cancel failed (`missed`)."""

    cancelled: int
    missed: list[tuple[str, RPCError]]
    unknown: list[tuple[str, RPCError]] = []
    """Cancels by id of starts that failed (`start_and_wait`): they may have made nothing."""

    def said(self, other: str = "") -> str:
        """ "3 started task(s) were cancelled where still running; nothing was reported" """
        said = f"{self.cancelled} {other}started task(s) were cancelled where still running"
        if self.missed:
            ids = ", ".join(workflow for workflow, _ in self.missed)
            said += (
                f"; {len(self.missed)} could not be ({describe(self.missed[0][1])}), still "
                f"running there: {ids} (`temporal workflow cancel --workflow-id ID` each)"
            )
        if self.unknown:
            ids = ", ".join(workflow for workflow, _ in self.unknown)
            said += (
                f"; {len(self.unknown)} whose start failed may have been started, and could not "
                f"be cancelled ({describe(self.unknown[0][1])}): {ids} (`temporal workflow "
                "cancel --workflow-id ID` each, once Temporal answers)"
            )
        return f"{said}; nothing was reported"


async def evaluate(
    settings: Settings,
    spec: TrainingRunInput,
    tasks: list[TaskSpec],
    eval_run: str,
    version: int,
    concurrency: int,
) -> list[AgentTaskResult]:
    """Each task's AgentTaskWorkflow, `concurrency` at a time, its results in order. Any error
    (TaskFailed at the first that fails, Ctrl-C's cancel, an RPCError) stops those waiting to
    start and cancels every one started, in Temporal, before it is raised (see the module)."""
    client = await connect(settings)
    slots = asyncio.Semaphore(concurrency)
    running: list[Handle] = []  # started, and not seen to end: the ones an error cancels
    stopped = asyncio.Event()

    async def one(task: TaskSpec) -> AgentTaskResult | None:
        async with slots:
            if stopped.is_set():  # the slot an error freed, before that error cancels this run
                return None
            try:
                return await start_and_wait(task)
            except BaseException:
                stopped.set()
                raise

    async def start_and_wait(task: TaskSpec) -> AgentTaskResult:
        workflow_id = f"{eval_run}-{task.id}"
        starting = asyncio.ensure_future(
            client.start_workflow(
                AgentTaskWorkflow.run,
                spec.eval_input(task, eval_run, version),
                id=workflow_id,
                task_queue=Queue.AGENT_TASKS.value,
            )
        )
        # a start that failed may be made on the server all the same: cancelled by its id
        by_id: Handle = client.get_workflow_handle(workflow_id, result_type=AgentTaskResult)
        try:  # a start cut short may still be made on the server: let it end, then cancel
            handle = await asyncio.shield(starting)
        except asyncio.CancelledError:
            try:
                running.append(await starting)
            except BaseException:  # it failed (or a second Ctrl-C): it may be made all the same
                running.append(by_id)
            raise
        except Exception:
            running.append(by_id)
            raise
        running.append(handle)
        try:
            result = await handle.result()
        except WorkflowFailureError as exc:  # it has ended: Temporal says OK to its cancel
            running.remove(handle)
            raise TaskFailed(task.id, exc) from exc
        running.remove(handle)
        return result

    try:  # the first error cancels the other runs and waits for them (a start on its way ends)
        results = await all_or_cancel(one(task) for task in tasks)
    except BaseException as exc:  # none of them goes on without this command
        cleared = await _cancel_all(running)
        if isinstance(exc, TaskFailed):  # evaluate.py says it, with the task
            exc.cleared = cleared
        else:
            why = "interrupted" if isinstance(exc, asyncio.CancelledError) else describe(exc)
            print(f"tempered eval: {why}; the {cleared.said()}", file=sys.stderr)
        raise
    return [result for result in results if result is not None]


async def _cancel_all(started: list[Handle]) -> Cleared:
    """Cancel each workflow started, in Temporal, at once."""
    outcomes = await asyncio.gather(*(_cancel(handle) for handle in started))
    failed = [
        (h, err) for h, err in zip(started, outcomes, strict=True) if isinstance(err, RPCError)
    ]
    missed = [(h.id, err) for h, err in failed if h.result_run_id is not None]
    unknown = [(h.id, err) for h, err in failed if h.result_run_id is None]  # by id: no start
    return Cleared(outcomes.count(True), missed, unknown)


async def _cancel(handle: Handle) -> bool | RPCError:
    """Ask Temporal to cancel a task's workflow: True where it did, False where it answered that
    the workflow has ended (NOT_FOUND; the dev server answers OK), the error where it failed."""
    try:
        await handle.cancel()
    except RPCError as err:
        return False if err.status is RPCStatusCode.NOT_FOUND else err
    return True
