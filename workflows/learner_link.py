"""The training run's side of its learner: the `LearnerWorkflow` it started, which outlives the
run's continues-as-new (`ParentClosePolicy.ABANDON`), so the two find each other by workflow id.

    link = LearnerLink(f"{run_workflow_id}-learner")
    link.done = done                             # the run's `learner_done` signal handler
    await link.send(Signal.ADD_GROUPS, [[group]])
    link.raise_if_failed()                       # LEARNER_FAILED, once it reported an error
    await link.finish()                          # train on what is queued, then end
    final = await link.final()                   # its last state, as `learner_done` told it
    await link.cancel()                          # the run was cancelled or failed
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from temporalio import workflow
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    from contracts.errors import ErrorType, fail
    from contracts.learner import LearnerDone, LearnerInput
    from contracts.names import Signal
    from workflows.signals import signal_run


class LearnerLink:
    def __init__(self, workflow_id: str, done: LearnerDone | None = None) -> None:
        self.workflow_id = workflow_id
        self.done = done
        """What the learner said when it ended (`learner_done`); None while it runs."""

    def ended(self) -> bool:
        return self.done is not None

    @property
    def error(self) -> str | None:
        return self.done.error if self.done is not None else None

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise fail(ErrorType.LEARNER_FAILED, f"the learner failed: {self.error}")

    async def send(self, signal: Signal, args: Sequence[Any] = ()) -> None:
        """Signal its current run; nothing once it has ended for good."""
        await signal_run(self.workflow_id, signal, args, gone=self.ended)

    async def finish(self) -> None:
        """Tell the learner to train on what is queued and end. Having taken every step it ends
        by itself, maybe before this lands; its `learner_done` (sent first) is then here."""
        await self.send(Signal.FINISH)

    async def final(self) -> LearnerInput:
        """The learner's last state, told by `learner_done` (it is no child of this run)."""
        await workflow.wait_condition(self.ended)
        self.raise_if_failed()
        assert self.done is not None and self.done.final is not None
        return self.done.final

    async def cancel(self) -> None:
        """Cancel it, unless it has ended (it outlives the run that started it by design, not
        the training: the run cancels it as it fails or is cancelled)."""
        if not self.ended():
            with contextlib.suppress(FailureError):  # it may have ended meanwhile
                await workflow.get_external_workflow_handle(self.workflow_id).cancel()
