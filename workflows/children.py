"""A training run's pending children against Temporal's limit of them.

    children = PendingChildren()
    children.started()                   # the learner: the run's first child, room or not
    children.full                        # a training task waits (the run's `_may_start`)
    await children.room()                # a held-out task waits, then
    children.started()                   # takes it at once (nothing runs in between)
    children.ended()                     # one ended (or failed to start)

Temporal fails the workflow task that would start a workflow's child past 2,000 pending
(`PendingChildWorkflowsLimitExceeded`), on every retry: the run would be stuck for good. The
count is every child the run has pending: its training tasks in flight, its evaluations'
held-out tasks in flight and, in the segment that started it, its learner (counted until that
segment ends). With `PENDING_CHILDREN_PATCH` none starts while `MAX_PENDING_CHILDREN` are; an
evaluation also starts at most `EVAL_WINDOW` of its own at a time (workflows/evaluations.py).

The count issues no command. The patch is asked once the count first reaches the limit: a run
that never does records no marker, and one of an earlier release replays as it ran (nothing
waited then). This module does not decide which child starts first: a freed slot goes to
whichever waiter runs first.
"""

from __future__ import annotations

from temporalio import workflow

MAX_PENDING_CHILDREN = 1_900
"""The most children a run has pending at once: Temporal's 2,000 less a margin (a server whose
limit was lowered a little, a child this count missed)."""
PENDING_CHILDREN_PATCH = "tempered-run-bounds-pending-children"
"""Marks runs that start no child past `MAX_PENDING_CHILDREN` pending and no more than
`EVAL_WINDOW` of one evaluation's at a time (before: `concurrency` bounded the training tasks
alone, and an evaluation started all its held-out tasks at once)."""


class PendingChildren:
    def __init__(self) -> None:
        self.count = 0
        self._bounded: bool | None = None  # None: not asked yet (the limit was never reached)

    @property
    def full(self) -> bool:
        """Whether a child must wait to start (never before the patch)."""
        return bool(self._bounded) and self.count >= MAX_PENDING_CHILDREN

    def started(self) -> None:
        """One more is pending: call it in the same step as the decision to start it."""
        self.count += 1
        if self.count >= MAX_PENDING_CHILDREN and self._bounded is None:
            self._bounded = workflow.patched(PENDING_CHILDREN_PATCH)

    def ended(self) -> None:
        self.count -= 1

    async def room(self) -> None:
        """Return once a child may start (at once while there is room: no yield, no command)."""
        while self.full:  # every waiter wakes when a slot frees: the first takes it
            await workflow.wait_condition(lambda: not self.full)
