"""A training run's look-ahead on its history budget: whether it must continue as new now.

    look_ahead = RunLookAhead(run_input, progress, evaluations)   # the run's, shared
    look_ahead.began()                   # as the run starts rolling out
    look_ahead.started()                 # a task's child is started
    look_ahead.full(rollouts=…, in_flight=…, started=…, learner_steps=…)  # before a start
    look_ahead.full(…, ending=True)      # before the ending
    look_ahead.full(…, idle=True)        # after a ping, nothing in flight (IDLE_BUDGET_PATCH)
    progress, evals = look_ahead.tails() # what the continue-as-new carries

The rule is workflows/budget.py's (`spent`): the history so far, plus what the children in flight
and the evaluations still to come will add (each at a task's average so far, in events at least
`EVENTS_PER_TASK`), plus the continue-as-new's own input (counted as the history's size when
the run began rolling out), reaches the `budget`. With `RUN_LOOK_AHEAD_PATCH` it also counts the
children started in the current workflow task once more (`UnrecordedStarts`), the tails the input
carries as they have grown since the run began, room for two `learner_progress` signals and, at
the ending, the learner's report (`ENDING_PATCH`: its state as reported, once per copy the
ending receives). Continuing as new, and draining first, is the run's
(workflows/training_run.py).

Waiting with nothing in flight (`idle`: the run pings its learner, each ping adds events), a
task is counted at its average as it was at the first ping of that wait (until a task starts
again), not as the pings since grew it; in a segment that started no task, at `EVENTS_PER_TASK`
events and `TASK_BYTES`: the held-out tasks still to come are counted at a task's size, not at
the pings' (which, times 100 held-out tasks, made segments of a few dozen events).

The look-ahead issues no command. `full` asks `RUN_LOOK_AHEAD_PATCH` (and under it, at the ending,
`ENDING_PATCH`) once the run has started a task. Measuring the tails reads `Evaluations.kept`,
which may ask `BASELINE_PATCH`: as the look-ahead is made, in each `full` under
`RUN_LOOK_AHEAD_PATCH`, and in `tails`.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contracts.evaluation import EvalResult
    from contracts.learner import LearnerProgress
    from contracts.run import TrainingRunInput
    from workflows.budget import (
        EVENTS_PER_TASK,
        PROGRESS_SIGNAL_BYTES,
        RESERVE_EVENTS,
        STEP_RECORD_BYTES,
        TASK_BYTES,
        Growth,
        HistoryMark,
        UnrecordedStarts,
        ending_bytes,
        signal_reserve,
        spent,
    )
    from workflows.evaluations import Evaluations
    from workflows.learner import HISTORY_TAIL

RUN_LOOK_AHEAD_PATCH = "tempered-run-look-ahead-bytes"
"""Marks runs whose history look-ahead counts the tails a continue-as-new carries as they have
grown, the children started in the current workflow task as not in the history yet, and, at the
ending, the learner's report (`learner_done`, one copy of its step records at 1 KiB each)."""
ENDING_PATCH = "tempered-run-ending-bytes"
"""Marks runs whose ending look-ahead counts the learner's state as reported (`state_bytes`)
once for each copy the ending receives: its `learner_done`, the run's result and, in the
segment that started the learner, the child's result (before it: one copy of 1 KiB a step)."""


class RunLookAhead:
    def __init__(
        self,
        run_input: TrainingRunInput,
        progress: list[LearnerProgress],
        evaluations: Evaluations,
    ) -> None:
        self._input = run_input
        self._progress = progress  # the run's own list: it appends and trims it in place
        self._evaluations = evaluations
        self._start = HistoryMark()  # the history when this run began rolling out
        self._unrecorded = UnrecordedStarts()
        self._tails_at_start = self._tails_bytes()
        self._idle_task: Growth | None = None  # a task's average at the first ping of a wait

    def began(self) -> None:
        """The run begins rolling out: a task's average is measured from here."""
        self._start.mark()

    def started(self) -> None:
        """A task's child was started in the current workflow task."""
        self._unrecorded.started()
        self._idle_task = None

    def full(
        self,
        *,
        rollouts: int,
        in_flight: int,
        started: int,
        learner_steps: int,
        ending: bool = False,
        idle: bool = False,
    ) -> bool:
        """Whether the history, with what the children in flight and the evaluations still to
        come will add (and, at the `ending`, the learner's last reports), reaches the budget;
        `rollouts` are the tasks this run started, `in_flight` those still running; `idle`:
        asked after a ping, nothing in flight."""
        if idle:
            if self._idle_task is None:
                measured = self._start.per_unit(rollouts) if rollouts else None
                self._idle_task = measured or Growth(EVENTS_PER_TASK, TASK_BYTES)
            per_task = self._idle_task
        elif not rollouts:
            return False  # a segment starts one task at least
        else:
            per_task = self._start.per_unit(rollouts)
        children = in_flight + self._evaluations.children_ahead(started, learner_steps, ending)
        # the continue-as-new event carries the next input (the result is about as large)
        last = self._start.size
        if workflow.patched(RUN_LOOK_AHEAD_PATCH):
            children += self._unrecorded.count
            last += self._tails_bytes() - self._tails_at_start
            last += signal_reserve(2, PROGRESS_SIGNAL_BYTES)
            if ending:
                last += self._ending_bytes(learner_steps)
        return spent(
            self._input.budget,
            ahead_events=max(EVENTS_PER_TASK, per_task.events) * children + RESERVE_EVENTS,
            ahead_bytes=per_task.size * children + last,
        )

    def tails(self) -> tuple[list[LearnerProgress], list[EvalResult]]:
        """What a continue-as-new carries that grows: the learner steps and evaluations kept."""
        return self._progress, self._evaluations.kept()

    def _tails_bytes(self) -> int:
        return sum(len(m.model_dump_json()) for tail in self.tails() for m in tail)

    def _ending_bytes(self, learner_steps: int) -> int:
        """What the learner's ending brings besides the run's tails (`budget.ending_bytes`)."""
        if not workflow.patched(ENDING_PATCH):  # one copy of the step records
            return STEP_RECORD_BYTES * min(self._input.steps, HISTORY_TAIL)
        return ending_bytes(
            steps=self._input.steps,
            done=learner_steps,
            reported=self._progress[-1].state_bytes if self._progress else 0,
            first_segment=self._input.resume is None,
            tail=HISTORY_TAIL,
        )
