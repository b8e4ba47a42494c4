"""`LearnerWorkflow`: turns finished GRPO groups into policy versions, one `train_step` at a time.

Groups arrive by the `add_groups` signal (from the training run, or any client). The learner
takes `groups_per_step` of them per step, in the order they came (the training run sends each in
time for the step it was started for: workflows/step_slots.py), runs the `train_step` activity
(queue `learner`), which publishes policy version step+1, and tells its parent
(`learner_progress`). A step's groups past a payload's share go by reference, stored in parts
first (workflows/learner_request.py). It ends after `max_steps`, or, once told `finish`, when
its queue is drained: it writes its ledger, carries what is pending, tells its parent
`learner_done` (also when it fails) with a copy, and carries again what came meanwhile.

Each group is trained on exactly once, with state that stays constant in size:
- A segment is one run between continues-as-new. It continues as new after `steps_per_run`
  steps, when the server suggests it, or before its history could pass `budget` (20% of
  Temporal's limits by default; looking one step ahead, as large as its largest, and at the
  next input as large as the state is now, with room for `burst` groups signalled meanwhile),
  whichever comes first; only `pending` groups (bounded by the producer's flow control) and the
  last `HISTORY_TAIL` step results travel with it. While the state is over `CARRY_BYTES` and a
  whole batch is pending, it trains first (`CARRY_PATCH`): a next input past Temporal's 2 MiB
  payload limit was refused on every retry. Pending groups past a payload's share travel (and
  end) by reference, read back first thing in the next segment (workflows/learner_carry.py).
- The task ids a segment trained on are written to the ledger (`record_ledger`, one object per
  segment, `keys.learner_ledger_key`) first thing in the next segment, which they travel to
  (or as the run ends); every step is also in its ack. So a segment ends in the workflow
  task that decides it: groups signalled while the ledger is written land in the next
  segment's history, and cannot push the ending one past its budget.
- A group whose id this segment has seen is dropped at once; before a later segment trains on
  a batch it asks the ledger (`find_consumed`) which ids an earlier segment took, and drops
  those: a re-sent group is trained on once however late it comes.

A cancelled learner (its run cancelled, or it alone) waits for a running step to stop, which
publishes nothing, then tells its parent and ends CANCELED. The exception is a cancel that
reaches the step in its publish, past its last stop check: the version is committed once
(`latest.json` names it; a retried step returns it), and the parent is not told of it.

Runs of earlier releases replay as they were: the ledger is behind
`workflow.patched(LEDGER_PATCH)` (before it, all consumed ids and steps were carried in the
input), writing it in the next segment behind `LEDGER_FIRST_PATCH` (before it, a segment
wrote its own before continuing, and looked ahead by its average step), waiting for a
cancelled step behind `STEP_WAIT_PATCH`, counting the next input at the state's size now
behind `LEARNER_LOOK_AHEAD_PATCH`, a step's groups by reference behind
`learner_request.STEP_PARTS_PATCH`, pending ones behind `learner_carry.CARRY_PARTS_PATCH`, and
the carry after the last ledger write behind `learner_carry.CARRY_LAST_PATCH`.
"""

from __future__ import annotations

import asyncio
from typing import NoReturn

from temporalio import workflow
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    from contracts.learner import (
        FindConsumedRequest,
        FindConsumedResponse,
        LearnerDone,
        LearnerInput,
        LearnerProgress,
        LedgerSegment,
        TrainStepResponse,
        TrajectoryGroup,
    )
    from contracts.names import Activity, SearchAttr, Signal
    from workflows.activity_options import activity_options, training_work
    from workflows.budget import (
        PAYLOAD_LIMIT,
        RESERVE_EVENTS,
        TASK_TIMEOUT,
        Growth,
        HistoryMark,
        signal_reserve,
        spent,
    )
    from workflows.cancellation import cancel_kept, raise_if_cancelled
    from workflows.search import search_attribute_updates
    from workflows.signals import signal_run

# not passed through: it builds contracts from the workflow's state, so it must see the contracts
# module the sandbox's workflow sees (a test's workflow module may import its own copy)
from workflows.learner_carry import CARRY_LAST_PATCH, carry, read_carried
from workflows.learner_request import train_request

STEP_EVENTS = 16
"""Events one step adds at least (look-ahead): its activities, the search-attribute upsert, the
progress signal, the groups' signals, and the workflow tasks they wake."""
HISTORY_TAIL = 100
"""Step results a segment carries (and the run reports); every step is in its ack."""
LEDGER_PATCH = "tempered-learner-ledger"
"""Marks runs that write the ledger and signal `learner_done`."""
LEDGER_FIRST_PATCH = "tempered-learner-ledger-first"
"""Marks runs that write the previous segment's ids first, and look ahead by their largest
step. Before, a burst of group signals while a segment wrote its ledger could pass its budget
(617 events of 600 in a run of 10 ms tasks: the cold first write took 7 signals, 28 events)."""
LEARNER_LOOK_AHEAD_PATCH = "tempered-learner-look-ahead-bytes"
"""Marks runs whose look-ahead counts the next input at the state's size now (its consumed ids,
step history and pending groups as they have grown). Before, it counted the ids alone, and a
segment could pass a byte budget by its history's growth."""
CARRY_PATCH = "tempered-learner-trains-before-a-large-carry"
"""Marks runs that, due to continue as new with a state over `CARRY_BYTES` and a whole batch
pending, train on it first (asked only then). Before, with more pending than a payload holds,
the continue-as-new's input was refused (TMPRL1103) on every retry of the workflow task."""
CARRY_BYTES = PAYLOAD_LIMIT // 2
"""The most a segment's state (its next input, as JSON) is before it trains first."""
STEP_WAIT_PATCH = "tempered-learner-waits-for-its-step"
"""Marks runs whose cancel waits for the running `train_step` to stop (its thread stops at the
next micro-batch and publishes nothing, activities/learner.py). Before, the learner ended at
once while its step trained on, and published a version after the cancel."""


@workflow.defn(name="LearnerWorkflow")
class LearnerWorkflow:
    @workflow.init
    def __init__(self, learner_input: LearnerInput) -> None:
        self._state = learner_input
        self._seen = set(learner_input.consumed) | {g.task_id for g in learner_input.pending}
        self._checked: set[str] = set()  # pending ids no earlier segment took
        self._finish = learner_input.finish_when_drained
        self._signals = 0
        self._steps = 0  # steps of this segment
        if learner_input.ledger_from is not None:
            self._first_step = learner_input.ledger_from
        else:  # an input of the release before the ledger lists every id since step 0
            self._first_step = 0 if learner_input.consumed else learner_input.step
        self._start = HistoryMark()  # the history when this run began
        self._write_first = False  # LEDGER_FIRST_PATCH
        self._looks_ahead = False  # LEARNER_LOOK_AHEAD_PATCH
        self._state_bytes = 0  # the state's size as JSON when this run began
        self._largest_group = 0  # the largest group this run carried or was sent, as JSON
        self._largest_step = Growth(0, 0)  # most events, and bytes, one step (wait included) added

    @workflow.run
    async def run(self, learner_input: LearnerInput) -> LearnerInput:
        try:
            await self._train()
        except (asyncio.CancelledError, FailureError) as err:
            if cancel_kept():  # also an activity failed by the cancel: cancelled, not failed
                reason = workflow.cancellation_reason() or "no reason given"
                done = LearnerDone(error=f"the learner was cancelled ({reason})")
                await self._tell_parent(done, once=True)  # the parent may be what cancelled
                raise asyncio.CancelledError(done.error) from err
            if isinstance(err, FailureError) and workflow.patched(LEDGER_PATCH):
                await self._tell_parent(LearnerDone(error=_reason(err)))
            raise
        if workflow.patched(CARRY_LAST_PATCH):
            await self._record_segment()
            await carry(self._state, unmarked=True)  # left over past a payload, by reference
            await self._tell_parent(LearnerDone(final=self._state.model_copy(deep=True)))
            await carry(self._state, unmarked=True)  # those signalled meanwhile, for the result
        else:  # the release before: carried first (groups signalled meanwhile stayed inline)
            await carry(self._state)
            if workflow.patched(LEDGER_PATCH):
                await self._record_segment()
                await self._tell_parent(LearnerDone(final=self._state))
        return self._state

    @workflow.signal(name=Signal.ADD_GROUPS)
    def add_groups(self, groups: list[TrajectoryGroup]) -> None:
        self._signals += 1
        for group in groups:
            self._largest_group = max(self._largest_group, len(group.model_dump_json()))
            if group.task_id not in self._seen:  # a re-sent group is trained on once
                self._seen.add(group.task_id)
                self._state.pending.append(group)

    @workflow.signal(name=Signal.FINISH)
    def finish(self) -> None:
        """Train on what is queued (a last partial batch included), then end."""
        self._finish = True

    @workflow.signal(name=Signal.PING)
    def ping(self) -> None:
        """The run's probe (`workflows/learner_link.py`): delivered is all it asks."""

    @workflow.query(name="status")
    def status(self) -> LearnerInput:
        return self._state

    async def _train(self) -> None:
        state = self._state
        self._seen |= await read_carried(state)  # before the mark: the input, read back
        self._start.mark()
        self._write_first = workflow.patched(LEDGER_FIRST_PATCH)
        self._looks_ahead = workflow.patched(LEARNER_LOOK_AHEAD_PATCH)
        self._state_bytes = len(state.model_dump_json())
        self._largest_group = max((len(g.model_dump_json()) for g in state.pending), default=0)
        if self._write_first and state.consumed:
            await self._record_segment()  # the previous segment's ids
        step_start = HistoryMark()
        step_start.mark()
        while state.step < state.max_steps:
            await workflow.wait_condition(
                lambda: (
                    len(state.pending) >= state.config.groups_per_step
                    or self._finish
                    or self._idle_and_spent()
                )
            )
            if self._idle_and_spent() and not self._trains_first():
                await self._continue_as_new()
            if not state.pending:
                break
            batch = await self._unconsumed_batch()
            if batch is None:
                continue  # re-sent groups were dropped: wait for others
            waits = workflow.patched(STEP_WAIT_PATCH)
            request = await train_request(state, batch)  # by reference past a payload
            response = await workflow.execute_activity(
                Activity.TRAIN_STEP.value,
                request,
                result_type=TrainStepResponse,
                **activity_options(
                    Activity.TRAIN_STEP,
                    state.heartbeat_timeout_s,
                    wait_for_cancel=waits,
                    work=training_work(batch, state.config),
                ),
            )
            if waits:
                raise_if_cancelled()  # the step ended before the cancel reached it
            del state.pending[: len(batch)]
            state.consumed.extend(g.task_id for g in batch)
            state.history.append(response)
            del state.history[:-HISTORY_TAIL]
            state.step += 1
            self._steps += 1
            workflow.upsert_search_attributes(
                search_attribute_updates(
                    {
                        SearchAttr.RUN_ID: state.run_id,
                        SearchAttr.POLICY_VERSION: response.policy.version,
                    }
                )
            )
            await self._report(state, response, batch)
            added, largest = step_start.grown(), self._largest_step
            self._largest_step = Growth(
                max(largest.events, added.events), max(largest.size, added.size)
            )
            step_start.mark()
            if (
                state.step < state.max_steps
                and (
                    self._steps >= state.steps_per_run
                    or workflow.info().is_continue_as_new_suggested()
                    or self._budget_spent()
                )
                and not self._trains_first()
            ):
                await self._continue_as_new()

    def _trains_first(self) -> bool:
        """Whether the segment, due to continue as new, trains first: its state is over
        `CARRY_BYTES` and a whole batch is pending (`CARRY_PATCH`, asked only then)."""
        state = self._state
        return (
            len(state.pending) >= state.config.groups_per_step
            and len(state.model_dump_json()) > CARRY_BYTES
            and workflow.patched(CARRY_PATCH)
        )

    def _idle_and_spent(self) -> bool:
        """Waiting for groups with the budget spent (many signals, few steps): continue now."""
        return (self._steps > 0 or self._signals > 0) and self._budget_spent()

    def _budget_spent(self) -> bool:
        """Whether one more step and the run's end would pass the budget."""
        step = self._next_step()
        return spent(
            self._state.budget,
            ahead_events=max(STEP_EVENTS, step.events) + RESERVE_EVENTS,
            # the continue-as-new event carries the next input: this run's, grown since
            ahead_bytes=step.size + self._start.size + self._input_growth(),
        )

    def _next_step(self) -> Growth:
        """What the next step is counted at: the largest step so far (in bytes, the average if
        larger). Before LEDGER_FIRST_PATCH, its events are the average step's; before
        LEARNER_LOOK_AHEAD_PATCH, its bytes are."""
        average = self._start.per_unit(max(self._steps, 1))
        events = self._largest_step.events if self._write_first else average.events
        size = max(average.size, self._largest_step.size) if self._looks_ahead else average.size
        return Growth(events, size)

    def _input_growth(self) -> int:
        """Bytes the next segment's input has over this run's (which the history's size at the
        start stands for): the state's growth, room for `burst` groups signalled while the
        continue-as-new is decided and, when the next step may be the last, the ending. Before
        LEARNER_LOOK_AHEAD_PATCH, the consumed ids alone; before LEDGER_FIRST_PATCH, nothing."""
        state = self._state
        if self._looks_ahead:
            size = len(state.model_dump_json())
            growth = size - self._state_bytes + signal_reserve(state.burst, self._largest_group)
            if self._finish or state.step + 1 >= state.max_steps:
                # the ending's `learner_done` and result carry the state twice (and its ledger
                # write the ids once more)
                growth += size
            return growth
        if self._write_first:
            return sum(len(task_id) + 3 for task_id in state.consumed)
        return 0

    async def _unconsumed_batch(self) -> list[TrajectoryGroup] | None:
        """The next batch, or None after dropping groups an earlier segment already took."""
        state = self._state
        batch = state.pending[: state.config.groups_per_step]
        unchecked = [g.task_id for g in batch if g.task_id not in self._checked]
        if state.segment == 0 or not unchecked:
            return batch
        found = await workflow.execute_activity(
            Activity.FIND_CONSUMED.value,
            FindConsumedRequest(
                run_id=state.run_id,
                segments=state.segment,
                task_ids=unchecked,
                chain=workflow.info().first_execution_run_id,
            ),
            result_type=FindConsumedResponse,
            **activity_options(Activity.FIND_CONSUMED, state.heartbeat_timeout_s),
        )
        self._checked.update(unchecked)
        if not found.consumed:
            return batch
        taken = set(found.consumed)
        state.pending = [g for g in state.pending if g.task_id not in taken]
        return None

    async def _continue_as_new(self) -> NoReturn:
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._write_first:  # by reference past a payload; may be cc5559e's (learner_carry.py)
            await carry(self._state, unmarked=True)
            self._state.ledger_from = self._first_step  # the next segment writes them
        elif workflow.patched(CARRY_LAST_PATCH):  # a segment of a release before it, live
            await self._record_segment()
            await carry(self._state, unmarked=True)
        else:  # the release before: carried first, then wrote its ledger (LEDGER_PATCH)
            await carry(self._state)
            if workflow.patched(LEDGER_PATCH):
                await self._record_segment()
        self._state.finish_when_drained = self._finish
        workflow.continue_as_new(
            self._state,
            task_timeout=TASK_TIMEOUT,
            # the next segment starts on the current build (worker versioning pins the others)
            initial_versioning_behavior=workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE,
        )

    async def _record_segment(self) -> None:
        """Move this segment's consumed ids from the state to the ledger."""
        state = self._state
        if not state.consumed:
            return
        await workflow.execute_activity(
            Activity.RECORD_LEDGER.value,
            LedgerSegment(
                run_id=state.run_id,
                segment=state.segment,
                first_step=self._first_step,
                next_step=state.step,
                consumed=state.consumed,
            ),
            **activity_options(Activity.RECORD_LEDGER, state.heartbeat_timeout_s),
        )
        state.segment += 1
        state.consumed, state.ledger_from = [], None
        self._first_step = state.step

    async def _report(
        self, state: LearnerInput, response: TrainStepResponse, batch: list[TrajectoryGroup]
    ) -> None:
        if state.parent_workflow_id is None:
            return
        progress = LearnerProgress(
            step=state.step,
            policy_version=response.policy.version,
            trained_groups=len(batch),  # sent, trained or not (the name is the wire's)
            trained=response.trained,
            skipped=response.skipped,
            reward_mean=response.reward_mean,
            loss=response.loss,
            dropped_stale=response.dropped_stale,
            staleness=state.step - 1 - min(g.policy_version for g in batch),
            state_bytes=len(state.model_dump_json()),
        )
        await signal_run(state.parent_workflow_id, Signal.LEARNER_PROGRESS, [progress])

    async def _tell_parent(self, done: LearnerDone, *, once: bool = False) -> None:
        """Signal `learner_done`; `once`: no retry (a parent that is gone stays gone)."""
        if self._state.parent_workflow_id is not None:
            parent = self._state.parent_workflow_id
            await signal_run(parent, Signal.LEARNER_DONE, [done], gone=lambda: once)


def _reason(error: BaseException | None) -> str:
    """`Activity task failed: step 3: loss is nan`: the messages down the cause chain."""
    messages = []
    while error is not None:
        messages.append(str(error))
        error = error.cause if isinstance(error, FailureError) else error.__cause__
    return ": ".join(messages)
