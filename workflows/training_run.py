"""`TrainingRunWorkflow`: one training run, end to end (what `tempered train` starts).

Loads the task suite (quarantined tasks skipped), publishes policy version 0, starts the
`LearnerWorkflow` as a child (workflows/run_begin.py), and keeps `concurrency` `AgentTaskWorkflow`
children in flight (fewer where they, the held-out tasks' and the learner would pass Temporal's
limit of pending children: workflows/children.py) until `steps × groups_per_step` groups have been
rolled out (or the time budget is spent, or a `stop` signal came: then the tasks in flight, the
learner's last step and the final evaluation still run, and the result's `stopped` says why, where
tasks were left unstarted: the signal's reason or `TIME_BUDGET_SPENT`). Each finished group is
signalled to the learner; rollouts go on while it trains (asynchronous RL) but never run more than
`grpo.max_staleness` steps ahead of it: the group for step b waits for version b − max_staleness and
is pinned to the newest version known when it starts (`max_staleness = 0` is synchronous, on-policy
GRPO), and is sent in time to be trained at step b, after a slow one of an earlier step if need be
(workflows/step_slots.py: the learner trains groups in the order they come). A flat group (no GRPO
signal) is not sent with `grpo.redraw_flat_groups` N: another task takes its slot, N times a run at
most, spread over its steps (DAPO's dynamic sampling; `redraws_allowed`). Held-out pass@1 (turn 1)
and the solve rate within `eval_turns` turns are measured before training, every `eval_every` steps
and after the last (greedy). With `keep_versions` N, versions that are neither 0, the newest N nor
read by a rollout or an evaluation in flight are deleted as the run goes (workflows/retention.py).

Bounded history (workflows/run_look_ahead.py): before each start and before the ending, a run
whose history could pass `budget` (20% of Temporal's limits by default), counting what the
children in flight and the evaluations to come will add, drains and continues as new with a
`RunResume` (suite, counters, the last `PROGRESS_TAIL` learner steps); also while it waits with
nothing in flight, after each ping to its learner (`IDLE_BUDGET_PATCH`). The learner outlives the
run that started it (`ParentClosePolicy.ABANDON`); they find each other by workflow id. A task's
child that fails, or a learner that cannot be reached (pinged while nothing is in flight:
learner_link.py), or a learner that reported an error, fails the run at once, also while it waits for its last tasks and its
learner's last steps (workflows/run_failure.py); a run that fails or is cancelled cancels the
learner and its children in flight.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any, NoReturn

from temporalio import workflow
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    from contracts.learner import LearnerDone, LearnerProgress, TrajectoryGroup, has_signal
    from contracts.names import Signal, learner_workflow_id, task_workflow_id
    from contracts.run import (
        LoadTasksResponse,
        RunProgress,
        RunResume,
        TrainingRunInput,
        TrainingRunResult,
        draw_order,
        drawn_task,
        redraws_allowed,
        spread,
    )
    from contracts.task import TaskSpec
    from workflows.agent_task import parse_workflow_input, run_agent_task
    from workflows.budget import TASK_TIMEOUT
    from workflows.children import PendingChildren
    from workflows.evaluations import Evaluations
    from workflows.learner_link import LearnerLink
    from workflows.retention import Retention
    from workflows.run_begin import begin, child_final
    from workflows.run_failure import RunFailure
    from workflows.run_look_ahead import RunLookAhead
    from workflows.step_slots import StepSlots

SPREAD_REDRAWS_PATCH = "tempered-run-spread-redraws"
"""Marks runs whose redraws of flat groups are spread over the learner steps."""
ORDERED_GROUPS_PATCH = "tempered-run-sends-groups-in-step-order"
"""Marks runs that send each group in time for the learner step it was started for
(workflows/step_slots.py). Before, each went as its task finished, and one that finished after
a later step's group could be trained a step late and dropped as stale."""
PROGRESS_TAIL = 100
"""Learner steps the run keeps (and its `progress` query shows)."""
IDLE_BUDGET_PATCH = "tempered-run-continues-as-new-while-idle"
"""Marks runs that, waiting with nothing in flight, look at their history budget after each ping
to their learner and continue as new once it is reached (before: about ten events a ping, every
`PROBE_EVERY`, until Temporal terminated the run at its limit)."""
BUDGET_SENDS_FLAT_PATCH = "tempered-run-sends-flat-groups-past-its-deadline"
"""Marks runs that send a flat group finishing at or after the time budget's deadline, as after
a `stop` (no task takes its slot then); before, it was redrawn: never sent, its slot empty."""
FLAT_ROUNDOFF_PATCH = "tempered-run-redraws-groups-flat-but-for-round-off"
"""Marks runs that take a group whose rewards differ by round-off only for flat
(`contracts.learner.has_signal`, which the learner trains by): before, it was sent."""
STOPPED_BY_SIGNAL = "stopped by signal"
"""Why a run stopped by a `stop` signal without a reason (no input, or not text) ended early."""
TIME_BUDGET_SPENT = "time budget spent"
"""Why a run that started no more tasks at its time budget's deadline ended before its steps
(its result's `stopped`, beside a `stop` signal's reason)."""


@workflow.defn(name="TrainingRunWorkflow")
class TrainingRunWorkflow:
    @workflow.init
    def __init__(self, raw: Any = None, *extra: Any) -> None:
        # any input, as the task's: bad input fails the run at once (`parse_workflow_input`)
        self._input = run_input = parse_workflow_input(TrainingRunInput, "run", raw, extra)
        resume = run_input.resume
        self._progress: list[LearnerProgress] = list(resume.progress) if resume else []
        self._rollouts: list[asyncio.Task[None]] = []
        self._in_flight = 0
        self._started = resume.started if resume else 0
        self._done = resume.done if resume else 0
        self._redrawn = resume.redrawn if resume else 0  # flat groups not sent to the learner
        learner_id = learner_workflow_id(workflow.info().workflow_id)  # done: ended as we drained
        self._failure = RunFailure()  # a task's child failed, or the learner cannot be reached
        self._learner = LearnerLink(
            learner_id, self._failure, resume.learner_done if resume else None
        )
        self._stopped: str | None = resume.stopped if resume else None  # the `stop` signal
        # said only (not `_stopped`, carried by the resume; flat groups: `_redraws`)
        self._stopped_early = False  # `_stopped` ended the rollouts, tasks left (a segment's own)
        self._budget_spent = False  # the deadline ended the rollouts (a later segment's too)
        self._retention = Retention(run_input, resume.pruned_below if resume else 1)
        evals, failed = resume.evals if resume else [], self._failure.evaluation_failed
        self._children = PendingChildren()  # Temporal's limit: tasks, held-out tasks, learner
        self._evaluations = Evaluations(
            run_input, evals, self._retention, run_agent_task, failed, self._children
        )
        if resume:
            self._evaluations.heldout = spread(resume.tasks.heldout, run_input.heldout_limit)
        self._look_ahead = RunLookAhead(run_input, self._progress, self._evaluations)
        self._learner.pinged = self._pinged
        self._segment: tuple[LoadTasksResponse, datetime | None] | None = None  # for `_pinged`
        self._ending = False  # the rollouts are over: the run waits for its ending
        # ORDERED_GROUPS_PATCH, asked as the run begins rolling out: the step each group is for
        self._ordered = False
        grpo = run_input.grpo  # the learner's `burst` is the run's concurrency
        self._slots = StepSlots(grpo.groups_per_step, self._filled, run_input.concurrency)

    @workflow.run
    async def run(self, raw: Any = None, *extra: Any) -> TrainingRunResult:
        run_input = self._input  # `raw` parsed (`__init__` takes what `run` takes)
        resume = run_input.resume
        learner = None
        if resume is None:
            tasks, learner = await begin(
                run_input, self._evaluations, self._children, self._learner.workflow_id
            )
            budget_s = run_input.time_budget_s
            deadline = workflow.now() + timedelta(seconds=budget_s) if budget_s else None
        else:
            tasks, deadline = resume.tasks, resume.deadline
        self._segment = (tasks, deadline)
        try:
            await self._roll_out(tasks, deadline)
            await self._failure.ending(self._failure.reaching(self._learner.finish()))
            final = await self._failure.ending(
                child_final(learner) if learner is not None else self._learner.final()
            )
        except (asyncio.CancelledError, FailureError):
            if not self._failure.learner_lost:  # it outlives this run by design, not training
                await self._learner.cancel()
            raise
        evaluations = self._evaluations
        if final.history and not evaluations.measured(final.history[-1].policy.version):
            evaluations.start(final.history[-1].policy.version)
        await asyncio.gather(*evaluations.jobs)
        await self._retention.finish(final.history[-1].policy.version if final.history else 0)
        return TrainingRunResult(
            run_id=run_input.run_id,
            steps=final.step,
            tasks_started=self._started,
            tasks_done=self._done,
            redrawn=self._redrawn,
            history=final.history,
            evals=sorted(evaluations.results, key=lambda e: e.policy_version),
            stopped=self._why_stopped,
        )

    @workflow.signal(name=Signal.LEARNER_PROGRESS)
    def learner_progress(self, progress: LearnerProgress) -> None:
        self._progress.append(progress)
        del self._progress[:-PROGRESS_TAIL]
        every = self._input.eval_every
        if every and progress.step % every == 0 and progress.step < self._input.steps:
            self._evaluations.start(progress.policy_version)
        self._retention.published(progress.policy_version)

    @workflow.signal(name=Signal.LEARNER_DONE)
    def learner_done(self, done: LearnerDone) -> None:
        self._learner.reported(done)

    @workflow.signal(name=Signal.STOP)
    def stop(self, reason: Any = None, *_: Any) -> None:
        """Start no more tasks (`tempered stop`); the rest of the run ends as usual (`stopped`
        in its result only where tasks were left to start: `_why_stopped`). The input
        is optional: without one (or with anything but non-empty text), `STOPPED_BY_SIGNAL`;
        inputs past the first are ignored (before, each failed every later workflow task)."""
        why = reason if isinstance(reason, str) and reason else STOPPED_BY_SIGNAL
        self._stopped = self._stopped or why

    @workflow.query(name="progress")
    def progress(self) -> RunProgress:
        return RunProgress(
            tasks_started=self._started,
            tasks_done=self._done,
            in_flight=self._in_flight,
            redrawn=self._redrawn,
            learner=self._progress,
            evals=self._evaluations.results,
            stopping=self._stopped or self._why_stopped,
        )

    @property
    def _why_stopped(self) -> str | None:
        """Why the run started no more tasks before its steps (None: it did not stop; nor did a
        `stop` once every task had started, which `progress` shows)."""
        if self._stopped_early:
            return self._stopped
        return TIME_BUDGET_SPENT if self._budget_spent else None

    async def _roll_out(self, tasks: LoadTasksResponse, deadline: datetime | None) -> None:
        run_input = self._input
        total = run_input.steps * run_input.grpo.groups_per_step
        order = draw_order(tasks.train, run_input.seed)
        self._look_ahead.began()
        self._ordered = workflow.patched(ORDERED_GROUPS_PATCH)
        while await self._task_due(total):
            await self._learner.wait(self._may_start, lambda: not self._in_flight, deadline)
            self._learner.raise_if_failed()
            self._failure.raise_if_failed()
            if self._stopped is not None:  # `_task_due`: tasks were left to start
                self._stopped_early = True
                break
            if deadline is not None and workflow.now() >= deadline:
                self._budget_spent = True
                break
            if self._history_full():
                await self._continue_as_new(tasks, deadline)
            task, version, step = drawn_task(order, self._started), self._latest_version, None
            if self._ordered:
                step = self._slots.next()
                self._slots.started(step)
            self._started += 1  # here, not in the task: the next pass reads it before that runs
            self._look_ahead.started()
            self._children.started()
            rollout = self._rollout_one(task, version, step)
            self._rollouts.append(self._retention.start(version, rollout))
        self._ending = True
        if self._history_full(ending=True):  # the run's ending must fit as well
            await self._continue_as_new(tasks, deadline)
        await self._failure.ending(asyncio.gather(*self._rollouts))

    async def _task_due(self, total: int) -> bool:
        """Whether fewer than `total` are `_filled` (with redraws left: once those in flight end,
        or the run failed)."""
        if self._filled >= total and self._redraws_left:
            await workflow.wait_condition(
                lambda: self._filled < total or self._in_flight == 0 or self._failure.wakes
            )
            self._failure.raise_if_woken()
        return self._filled < total

    @property
    def _filled(self) -> int:
        """Groups started that may reach the learner (a redrawn flat one frees its slot)."""
        return self._started - self._redrawn

    @property
    def _redraws_left(self) -> bool:
        return self._redrawn < self._input.grpo.redraw_flat_groups

    @property
    def _may_redraw(self) -> bool:
        """Whether a flat group finishing now is redrawn: with the patch, the run's budget is
        spread over its steps (`redraws_allowed`); before it, the first flat groups took it all."""
        budget, steps = self._input.grpo.redraw_flat_groups, self._input.steps
        spread = workflow.patched(SPREAD_REDRAWS_PATCH)
        return self._redrawn < (
            redraws_allowed(budget, steps, self._learner_steps) if spread else budget
        )

    def _redraws(self, rewards: list[float]) -> bool:
        """Whether a group finishing now is redrawn: flat, `_may_redraw`, and a task may still
        take its slot: not after a `stop`, nor at or after the time budget's deadline
        (`BUDGET_SENDS_FLAT_PATCH`, asked only then; before, such a group was thrown away)."""
        if not self._may_redraw or self._stopped is not None or has_signal(rewards):
            return False
        if len(set(rewards)) > 1 and not workflow.patched(FLAT_ROUNDOFF_PATCH):
            return False  # apart by round-off only: a signal to the release before
        deadline = self._segment[1] if self._segment is not None else None
        late = deadline is not None and workflow.now() >= deadline  # `_budget_spent` or soon
        return not (late and workflow.patched(BUDGET_SENDS_FLAT_PATCH))

    def _may_start(self) -> bool:
        """A slot is free (of `concurrency`, and of the run's pending children:
        workflows/children.py) and the learner is far enough along for the next group (or the
        learner or a task failed: the run fails too; or the run was told to stop). Bounded
        staleness: the group for learner step b (`StepSlots.next`; before ORDERED_GROUPS_PATCH,
        counted over `_filled`) is sampled from a version ≥ b − max_staleness."""
        grpo = self._input.grpo
        step = self._slots.next() if self._ordered else self._filled // grpo.groups_per_step
        in_flight_ok = self._in_flight < self._input.concurrency and not self._children.full
        ready = in_flight_ok and self._learner_steps >= step - grpo.max_staleness
        failed = self._learner.error is not None or self._failure.error is not None
        return ready or failed or self._stopped is not None

    def _history_full(self, *, ending: bool = False, idle: bool = False) -> bool:
        """Whether the history could pass the budget before what is in flight is done
        (workflows/run_look_ahead.py); at the `ending`, with the learner's last reports."""
        return self._look_ahead.full(
            rollouts=len(self._rollouts),
            in_flight=self._in_flight,
            started=self._started,
            learner_steps=self._learner_steps,
            ending=ending,
            idle=idle,
        )

    async def _pinged(self) -> None:
        """After a ping, nothing in flight: continue as new once the budget is reached
        (`IDLE_BUDGET_PATCH`, asked before the look-ahead)."""
        if self._segment is None or not workflow.patched(IDLE_BUDGET_PATCH):
            return
        if self._history_full(ending=self._ending, idle=True):
            await self._continue_as_new(*self._segment)

    async def _continue_as_new(
        self, tasks: LoadTasksResponse, deadline: datetime | None
    ) -> NoReturn:
        """Drain (every child finished and reported), then continue as new from here."""
        while True:  # a `learner_progress` arriving meanwhile may start one more evaluation
            evaluations = self._evaluations
            drain = asyncio.gather(*self._rollouts, *evaluations.jobs, self._retention.drain())
            await self._failure.draining(drain)
            await workflow.wait_condition(workflow.all_handlers_finished)
            if evaluations.idle and self._retention.idle:
                break
        self._learner.raise_if_failed()
        progress, evals = self._look_ahead.tails()
        resume = RunResume(
            tasks=tasks,
            started=self._started,
            done=self._done,
            redrawn=self._redrawn,
            pruned_below=self._retention.pruned_below,
            progress=progress,
            evals=evals,
            deadline=deadline,
            segment=(self._input.resume.segment if self._input.resume else 0) + 1,
            stopped=self._stopped,
            learner_done=self._learner.done,
        )
        workflow.continue_as_new(
            self._input.model_copy(update={"resume": resume}),
            task_timeout=TASK_TIMEOUT,
            # the next segment starts on the current build (worker versioning pins the others)
            initial_versioning_behavior=workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE,
        )

    @property
    def _learner_steps(self) -> int:
        return max((p.step for p in self._progress), default=0)

    @property
    def _latest_version(self) -> int:
        """Newest published policy version the learner has told us of (pinned per rollout)."""
        return max((p.policy_version for p in self._progress), default=0)

    async def _rollout_one(self, task: TaskSpec, policy_version: int, step: int | None) -> None:
        """Roll `task` out on `policy_version` and send its group to the learner; `step`: the
        learner step it is for (None before ORDERED_GROUPS_PATCH: sent as it finishes)."""
        self._in_flight += 1
        try:
            result = await run_agent_task(
                self._input.task_input(task, policy_version),
                task_workflow_id(self._input.run_id, task.id),
            )
        except FailureError as exc:  # its group never comes: the run would wait for it forever
            self._failure.task_failed(task.id, exc)
            raise
        finally:
            self._in_flight -= 1
            self._children.ended()
        self._done += 1
        if self._redraws(result.rewards):
            self._redrawn += 1  # dynamic sampling: the next task takes its place
            if step is not None:
                self._slots.redrawn(step)  # a held group of a later step may take its place
                await self._slots.send_due(self._send_groups)
            return
        group = TrajectoryGroup(
            task_id=task.id,
            trajectories=result.trajectories,
            rewards=result.rewards,
            policy_version=min(result.policy_versions),
        )
        if step is None:
            await self._send_groups([group])
        else:
            self._slots.finished(step, group)
            await self._slots.send_due(self._send_groups)

    async def _send_groups(self, groups: list[TrajectoryGroup]) -> None:
        await self._failure.reaching(self._learner.send(Signal.ADD_GROUPS, [groups]))
