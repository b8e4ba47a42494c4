"""The workspace sessions of one task's group, as `AgentTaskWorkflow` drives them.

    sessions = Sessions(task_input, group)
    await sessions.open_first(group.episodes)     # INIT: a session per episode, on one worker
    outcomes = await sessions.step(step, generated)   # EXECUTE: the tool calls, where they live
    await sessions.verify()                       # DONE: the verifier's verdicts → the group
    await sessions.close()                        # DONE, failure or cancellation; raises a cancel

Sessions are sticky: a step goes to the task queue of the sandbox worker that holds its
session (`SessionRef.queue`), with a schedule-to-start timeout of `session_timeout_s`. When
that worker is gone (the timeout, which Temporal does not retry) or no longer holds the session
(`SessionLost`), the sessions are restored from their last snapshots by `open_sessions` on the
shared `sandbox` queue and the step runs again on the worker that restored them; the workflow
records the step once. A worker that was only slow keeps its orphaned sessions until its TTL.
A restore after a worker failed the step `STEP_ATTEMPTS` times names it
(`OpenSessionsRequest.lost_on`, its queue): it declines that restore on the shared queue, for
`session_timeout_s`, so that another worker restores them (activities/environment.py); before,
a broken host that took its own restore lost them again, until `MAX_RESTORES` failed the task.
A worker gone or one that lost the sessions (`SessionLost`: closed, reaped) is not named: it is
no sign of a broken host, and it may be the only worker. Only the request's content changes, not
the commands: no patch; but a sandbox worker of a build before `lost_on` cannot read such a
request (its contracts forbid unknown fields: the SDK retries the open until a worker of this
build takes it), so upgrade sandbox workers before agent-tasks workers.
Episodes that ended on a worker before it went keep its queue; `close` sends nothing to a queue
found gone (behind `GONE_PATCH`): its sessions went with its process, and the next sandbox
worker's sweep (`sweep_dead`) removes what it left on the host; one only cut off from Temporal
closes them on its TTL. Before, the close waited out `session_timeout_s` on that queue first.
A step whose sessions are lost `MAX_RESTORES` times running fails the task (`SessionLost`):
a step that takes its worker down each time would otherwise restore and lose them for ever
(behind `RESTORE_LIMIT_PATCH`). A step that its worker fails `STEP_ATTEMPTS` times (a lasting
platform fault there: `SandboxInfraError`, a full disk) is a lost session too: restored
elsewhere, within `MAX_RESTORES` (behind `STEP_ATTEMPTS_PATCH`; before, it was retried on that
worker's queue for ever). The untouched workspace is verified beside the final ones,
as sample G (`verify`, behind `UNTOUCHED_PATCH`): rewards measure the change an episode made.

A step runs one `env_step` per worker queue at once. When one of them fails (its error, or
`SessionLost` after its restores) or the task is cancelled, the others are stopped before the
step raises: their activities (and a restore under way) are cancelled and waited for
(WAIT_CANCELLATION_COMPLETED; they heartbeat, so the cancel reaches them and they stop), and
the first error is raised as it was; so `close`, which the task runs next, never closes a
session a step still runs in, and no step runs on after the task decided. Sessions that a
restore opened although it was cancelled are kept on their episodes, which `close` closes
(behind `STOP_PATCH`: before it the first error failed the step at once, the other queues'
steps ran on, and a cancel did not wait for them). A cancel during `close` (a run cancelling
its tasks as a group ends) is raised once the closes end (`CLOSE_WAITS_PATCH`); before, it
abandoned them (TRY_CANCEL), and the sessions kept their uid slots until the worker's TTL.
Sessions whose live worker failed their step `STEP_ATTEMPTS` times are closed there before
the restore (`CLOSE_FAILED_PATCH`; before, they stayed until the TTL), in one attempt ended by
`CLOSE_FAILED_WITHIN` (a step attempt still running there holds the locks the close waits for).
So no close of them starts after the restore: one still running keeps their ids `closing` on the
host, and a restore there (the same ids) awaits it (`WorkspaceEnvironment.reset`) first.

A task cancelled during its first open waits for the open too (`open_first`, behind
`OPEN_PATCH`): an open that finished before the cancel reached it returns its sessions, which
are kept on their episodes for `close`; before, the task moved on at once and they stayed open
until the worker's TTL. Under it, a stop first takes what already came back in the same
workflow task (`_stop`): the SDK raises a cancel over an activity result it has not yet handed
to the workflow, so an open (or restore) that finished as the cancel came would be lost.
Workflow code: contracts and Temporal only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from contracts.episode import (
        CloseSessionsRequest,
        CloseSessionsResponse,
        EnvStepItem,
        EnvStepOutcome,
        EnvStepResponse,
        OpenSessionsResponse,
        VerifyResponse,
    )
    from contracts.errors import ErrorType, fail
    from contracts.names import Activity
    from contracts.rollout import EpisodeState, GenerateResponse
    from contracts.task import AgentTaskInput, WorkspaceSpec
    from workflows.activity_options import activity_options, programs_work
    from workflows.episodes import EpisodeGroup
    from workflows.requests import (
        env_step_parts,
        env_step_request,
        open_sessions_request,
        sessions_by_queue,
        verify_request,
    )
    from workflows.session_faults import attempts_spent, session_lost, worker_gone

CLOSE_ATTEMPTS = 3
"""Closing sessions is best effort: a few tries, then the sandbox worker's TTL reaps them."""
CLOSE_FAILED_WITHIN = timedelta(seconds=30)
"""The most a restore waits for the close of its sessions on the worker that failed their step
(`CLOSE_FAILED_PATCH`); before, `CLOSE_ATTEMPTS` of 2 minutes each."""
MAX_RESTORES = 3
"""Restores of one step's sessions before the task fails: workers come and go, but not three
times during one step unless the step itself takes them down."""
STEP_ATTEMPTS = 4
"""Attempts of an `env_step` on its sessions' worker before they are restored elsewhere (behind
`STEP_ATTEMPTS_PATCH`): a platform fault that outlasts them (`SandboxInfraError`, a heartbeat
timeout, an `OSError` such as a full disk: 7 s of the retry backoff) is the worker's, and other
workers may run the step; counted as a restore (`MAX_RESTORES`)."""
STEP_ATTEMPTS_PATCH = "tempered-session-step-attempts"
"""Marks runs whose steps try their worker `STEP_ATTEMPTS` times, then restore the sessions
elsewhere; its marker comes with the first step. Before, a step retried a lasting fault of its
worker for ever on that worker's queue: the sessions never moved and the task never ended."""
RESTORE_LIMIT_PATCH = "tempered-session-restore-limit"
UNTOUCHED_PATCH = "tempered-verify-untouched"
"""Before it, a workspace episode's reward was its verifier's score itself (`verify`)."""
STOP_PATCH = "tempered-sessions-stop-steps"
"""Marks runs whose steps wait for a cancel (its marker comes with the first step) and whose
failing or cancelled step stops its other queues' steps before it raises (`_step_each`)."""
GONE_PATCH = "tempered-sessions-close-skips-gone"
"""Marks runs whose close skips the queues of workers found gone (`close`); its marker comes
only with a close that skips one."""
OPEN_PATCH = "tempered-sessions-open-waits"
"""Marks runs whose first open waits for a cancel (its marker comes with it, at INIT), and whose
stops take what already came back before they cancel (`open_first`, `_stop`). Its marker costs
two events per workspace task."""
CLOSE_WAITS_PATCH = "tempered-sessions-close-waits"
"""Marks runs whose close, when the task is cancelled during it, runs to its end before the
cancel is raised (`_close_each`); its marker comes only with such a cancel."""
CLOSE_FAILED_PATCH = "tempered-sessions-close-failed-step"
"""Marks runs that close a step's sessions on the worker that failed it `STEP_ATTEMPTS` times
before they are restored elsewhere (`_step_on`); its marker comes only with such a restore."""


class Sessions:
    """Opens, steps, verifies and closes the sessions of `group`'s episodes."""

    def __init__(self, task_input: AgentTaskInput, group: EpisodeGroup):
        if task_input.task.workspace is None:
            raise fail(ErrorType.INVALID_TASK, f"task {task_input.task.id} has no workspace")
        self.input, self.group = task_input, group
        self.workspace: WorkspaceSpec = task_input.task.workspace
        self._stopping = False
        """Set while a step stops its queues' steps: none starts new work (`_step_each`)."""
        self._settles = False
        """`OPEN_PATCH`: a stop takes the results already delivered before it cancels."""
        self._gone: set[str] = set()
        """The queues of workers found gone (a step's schedule-to-start timeout), and not seen
        since: `close` sends them nothing (`GONE_PATCH`)."""

    async def open_first(self, episodes: list[EpisodeState]) -> None:
        """INIT: a session per episode. Behind `OPEN_PATCH` a cancel of the task stops the
        open and waits for it (`_stop`); what it opened is kept on the episodes, for `close`,
        and the cancel is raised."""
        if not workflow.patched(OPEN_PATCH):  # histories before it: a cancel moved on at once
            await self.open(episodes)
            return
        self._settles = True
        opening = asyncio.create_task(self.open(episodes, waits=True))
        try:
            await workflow.wait([opening])
        except asyncio.CancelledError:  # the task was cancelled
            await self._stop([opening])
            raise
        opening.result()

    async def open(
        self,
        episodes: list[EpisodeState],
        restore: bool = False,
        waits: bool = False,
        lost_on: Sequence[str] = (),
    ) -> None:
        """A session per episode, on one worker: fresh, or from each one's last snapshot;
        `waits`: a cancel waits for the activity to end (what it opened is kept); `lost_on`:
        the queues of the workers that lost them, which decline the restore for
        `session_timeout_s` (another worker should take it)."""
        task_input = self.input
        opened = await workflow.execute_activity(
            Activity.OPEN_SESSIONS.value,
            open_sessions_request(task_input, self.workspace, episodes, restore, lost_on),
            result_type=OpenSessionsResponse,
            **activity_options(
                Activity.OPEN_SESSIONS, task_input.heartbeat_timeout_s, wait_for_cancel=waits
            ),
        )
        for episode in episodes:
            episode.session = opened.sessions[episode.sample]
            self._gone.discard(episode.session.queue)  # answered: a worker polls it again

    async def step(self, step: int, generated: GenerateResponse) -> dict[int, EnvStepOutcome]:
        """Run every completion's tool call: one `env_step` per worker holding sessions."""
        items_by_queue = env_step_parts(self.group.episodes, generated.completions)
        if workflow.patched(STOP_PATCH):
            parts = await self._step_each(step, items_by_queue)
        else:  # histories recorded before it: the first error at once, the others run on
            parts = await asyncio.gather(*(self._step_on(step, items) for items in items_by_queue))
        return {o.sample: o for part in parts for o in part}

    async def _step_each(
        self, step: int, parts: list[list[EnvStepItem]]
    ) -> list[list[EnvStepOutcome]]:
        """Every part on its queue at once; the first part that fails, or the task's cancel,
        stops the others (`_stop`) before its error (or the cancel) is raised."""
        self._stopping = False
        tasks = [asyncio.create_task(self._step_on(step, items, waits=True)) for items in parts]
        try:
            await workflow.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        except asyncio.CancelledError:  # the task was cancelled
            await self._stop(tasks)
            raise
        for task in tasks:
            if task.done() and (task.cancelled() or task.exception() is not None):
                await self._stop(tasks)
                task.result()  # raises the first failure, as it was
        return [task.result() for task in tasks]

    async def _stop(self, tasks: Sequence[asyncio.Task[Any]]) -> None:
        """Cancel the steps (or the open) still running and wait until each has ended (its
        activity reported the cancel, or finished first); a cancel of the task meanwhile is
        raised once they have. `OPEN_PATCH`: first let the results this workflow task brought
        reach their tasks (a condition is checked once nothing else is ready), so a task whose
        activity has ended is not cancelled, which would drop its result."""
        self._stopping = True
        cancelled = False
        if self._settles:
            try:
                await workflow.wait_condition(lambda: True)
            except asyncio.CancelledError:
                cancelled = True
        for task in tasks:
            task.cancel()  # a task awaiting its activity asks Temporal to cancel it
        while pending := [t for t in tasks if not t.done()]:
            try:
                await workflow.wait(pending)
            except asyncio.CancelledError:
                cancelled = True
        for task in tasks:  # their errors are the stop's own: retrieved, not raised
            if not task.cancelled():
                task.exception()
        if cancelled:
            raise asyncio.CancelledError("cancelled while the step's activities stopped")

    async def _step_on(
        self, step: int, items: list[EnvStepItem], waits: bool = False
    ) -> list[EnvStepOutcome]:
        """Run the step where its sessions live; restore them elsewhere if they are lost, or
        (`STEP_ATTEMPTS_PATCH`) if their worker failed the step `STEP_ATTEMPTS` times.
        `waits` (`STOP_PATCH`): a cancel waits for the activities to end, and once the step
        is stopping nothing new starts."""
        task_input, restores = self.input, 0
        lost_on: list[str] = []  # the queues of the workers that failed the step
        bounded = workflow.patched(STEP_ATTEMPTS_PATCH)
        while True:
            if self._stopping:  # a restore ended after the stop (its sessions are kept)
                raise asyncio.CancelledError("the step was stopped")
            queue, request = items[0].session.queue, env_step_request(task_input, step, items)
            try:
                response = await workflow.execute_activity(
                    Activity.ENV_STEP.value,
                    request,
                    result_type=EnvStepResponse,
                    **activity_options(
                        Activity.ENV_STEP,
                        task_input.heartbeat_timeout_s,
                        work=programs_work(request),
                        queue=queue,
                        schedule_to_start_s=task_input.session_timeout_s,
                        attempts=STEP_ATTEMPTS if bounded else 0,
                        wait_for_cancel=waits,
                    ),
                )
                self._gone.discard(queue)
                return response.outcomes
            except ActivityError as error:
                if worker_gone(error):
                    self._gone.add(queue)
                moves = session_lost(error) or (bounded and attempts_spent(error))
                if not moves or self._stopping:
                    raise
                why, failed_here = "lost the sessions", not session_lost(error)
                if failed_here:
                    why = f"failed the step {STEP_ATTEMPTS} times ({error.cause})"
                    if queue not in lost_on:  # a broken host, alive: not to restore them
                        lost_on.append(queue)
            lost = [self.group.episodes[i.sample] for i in items]
            if restores >= MAX_RESTORES and workflow.patched(RESTORE_LIMIT_PATCH):
                raise fail(
                    ErrorType.SESSION_LOST,
                    f"the sessions of samples {[e.sample for e in lost]} were lost "
                    f"{restores + 1} times at step {step} (last on {queue}, which {why}): "
                    "the step takes its sandbox worker down, or the workers keep going or failing",
                )
            workflow.logger.warning(
                "sandbox worker %s %s at step %d (samples %s): restoring them",
                queue,
                why,
                step,
                [e.sample for e in lost],
            )
            if failed_here and workflow.patched(CLOSE_FAILED_PATCH):  # alive, and holds them
                ids = [i.session.session_id for i in items]
                await self._close_each({queue: ids}, within=CLOSE_FAILED_WITHIN)
            await self.open(lost, restore=True, waits=waits, lost_on=lost_on)
            restores += 1
            items = [
                i.model_copy(update={"session": e.session})
                for i, e in zip(items, lost, strict=True)
            ]

    async def verify(self) -> None:
        """Score each final workspace in a fresh verifier sandbox; the group takes the verdicts,
        each measured from the untouched workspace's (verified beside them, as sample G)."""
        task_input, episodes = self.input, self.group.episodes
        untouched = len(episodes)
        request = verify_request(
            task_input, self.workspace, episodes, workflow.patched(UNTOUCHED_PATCH)
        )
        verified = await workflow.execute_activity(
            Activity.VERIFY_EPISODES.value,
            request,
            result_type=VerifyResponse,
            **activity_options(
                Activity.VERIFY_EPISODES,
                task_input.heartbeat_timeout_s,
                work=programs_work(request),
            ),
        )
        baseline = [v.score for v in verified.verdicts if v.sample == untouched]
        self.group.judge(
            [v for v in verified.verdicts if v.sample != untouched],
            untouched=baseline[0] if baseline else None,
        )

    async def close(self) -> None:
        """Close every session, on its worker's queue; best effort: raises only a cancel of the
        task, once the closes have ended (`CLOSE_WAITS_PATCH`). Sessions on a worker found gone
        are left to the sweeps (`GONE_PATCH`): its queue would only time out, after
        `session_timeout_s`, before the task could go on."""
        by_queue = sessions_by_queue(self.group.episodes)
        if (gone := sorted(self._gone & by_queue.keys())) and workflow.patched(GONE_PATCH):
            workflow.logger.info("not closing sessions on %s: its worker is gone", gone)
            for queue in gone:
                del by_queue[queue]
        await self._close_each(by_queue, CLOSE_WAITS_PATCH)

    async def _close_each(
        self, ids: dict[str, list[str]], patch: str | None = None, within: timedelta | None = None
    ) -> None:
        """Close each queue's sessions (`ids`), all at once; `within`: in one attempt, ended
        by then. A cancel of the task meanwhile is raised once they have ended; where `patch` is
        given and a history before it is replayed, the cancel was raised at once and the closes'
        activities abandoned (TRY_CANCEL)."""
        closing = asyncio.gather(*(self._close_on(q, each, within) for q, each in ids.items()))
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError as cancel:
            if patch is not None and not workflow.patched(patch):
                closing.cancel()
                await closing  # raises the cancel once their activities' cancels are asked
            while not closing.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(closing)
            raise cancel

    async def _close_on(self, queue: str, ids: list[str], within: timedelta | None) -> None:
        try:
            await workflow.execute_activity(
                Activity.CLOSE_SESSIONS.value,
                CloseSessionsRequest(session_ids=ids),
                result_type=CloseSessionsResponse,
                **activity_options(
                    Activity.CLOSE_SESSIONS,
                    self.input.heartbeat_timeout_s,
                    queue=queue,
                    schedule_to_start_s=self.input.session_timeout_s,
                    attempts=CLOSE_ATTEMPTS if within is None else 1,
                    within=within,
                ),
            )
        except ActivityError as error:
            workflow.logger.warning("closing sessions on %s failed: %s", queue, error.cause)
