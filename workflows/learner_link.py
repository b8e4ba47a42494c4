"""The training run's side of its learner: the `LearnerWorkflow` it started, which outlives the
run's continues-as-new (`ParentClosePolicy.ABANDON`), so the two find each other by workflow id.

    link = LearnerLink(learner_workflow_id(run_wf_id), failure)  # failure: the run's RunFailure
    link.reported(done)                          # the run's `learner_done` signal handler
    link.pinged = hook                           # awaited after each ping (the run's budget)
    await link.send(Signal.ADD_GROUPS, [[group]])
    link.raise_if_failed()                       # LEARNER_FAILED, once it reported an error
    await link.finish()                          # train on what is queued, then end
    final = await link.final()                   # its last state, as `learner_done` told it
    await link.cancel()                          # the run was cancelled or failed (retried)
    await link.wait(ready, idle, deadline)       # probing it while nothing is in flight

A learner terminated from the UI or the CLI ends without `learner_done`. The run notices as a
signal to it fails (`RunFailure.reaching`): with tasks in flight, the next group's `add_groups`;
with nothing in flight, a wait (`wait`, `final`) sends `Signal.PING` every `PROBE_EVERY`
(`PROBE_PATCH`; before it, such a run waited for good and read its time budget only when a
wait woke). After each ping it awaits `pinged`: the run continues as new there once its history
budget is reached (workflows/training_run.py, `IDLE_BUDGET_PATCH`). A learner that reported an
error is the run's failure at once (`RunFailure.learner_failed`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    from contracts.errors import ErrorType, fail
    from contracts.learner import LearnerDone, LearnerInput
    from contracts.names import Signal
    from workflows.run_failure import RunFailure
    from workflows.signals import RETRY_DELAYS_S, signal_run

PROBE_PATCH = "tempered-run-probes-its-learner"
"""Marks runs that, waiting with nothing in flight, probe their learner every `PROBE_EVERY` and
end their rollouts at the time budget's deadline while they wait (asked at a run's first
wait)."""
CANCEL_RETRY_PATCH = "tempered-run-retries-its-learner-cancel"
"""Marks runs whose cancel of their learner, finding no run, is retried (`LearnerLink.cancel`);
before, a failed cancel was dropped and the learner ran on for good."""
PROBE_EVERY = timedelta(minutes=2)
"""How often a run waiting with nothing in flight signals its learner (a timer and a signal:
about four events each; a CPU learner step takes about two minutes)."""


class LearnerLink:
    def __init__(
        self, workflow_id: str, failure: RunFailure, done: LearnerDone | None = None
    ) -> None:
        self.workflow_id = workflow_id
        self.failure = failure
        """The run's failure: a ping that cannot be delivered fails it (`reaching`)."""
        self.done = done
        """What the learner said when it ended (`learner_done`); None while it runs."""
        self.pinged: Callable[[], Awaitable[None]] | None = None
        """Awaited after each ping (`wait`): the run's look at its history budget."""

    def reported(self, done: LearnerDone) -> None:
        """The learner's `learner_done`: an error in it is the run's failure too."""
        self.done = done
        if done.error is not None:
            self.failure.learner_failed(done.error)

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
        await self.wait(self.ended, lambda: True, None)
        self.raise_if_failed()
        assert self.done is not None and self.done.final is not None
        return self.done.final

    async def wait(
        self,
        condition: Callable[[], bool],
        idle: Callable[[], bool],
        deadline: datetime | None,
    ) -> None:
        """Wait for `condition`. While `idle()` (nothing in flight: no signal would go to the
        learner), probe the learner every `PROBE_EVERY` (an undeliverable ping fails the run:
        `RunFailure.reaching`) and return at `deadline` (the time budget's end) if that comes
        first. A learner that ended with no error while the run waits on it with nothing in
        flight (told `finish` by someone else) fails the run with LEARNER_FAILED: it takes no
        more steps. That needs no patch: the loop before spun there in one activation (a
        deadlock), so no history went past it."""
        if not workflow.patched(PROBE_PATCH):
            await workflow.wait_condition(condition)  # for good
            return
        while True:
            probing, timeout = idle() and not self.ended(), PROBE_EVERY
            if probing and deadline is not None:
                if workflow.now() >= deadline:
                    return
                timeout = min(timeout, deadline - workflow.now())

            def woken(probing: bool = probing) -> bool:
                return condition() or idle() != probing

            try:
                await workflow.wait_condition(woken, timeout=timeout if probing else None)
            except TimeoutError:
                await self.failure.reaching(self.send(Signal.PING))
                if self.pinged is not None:
                    await self.pinged()
            if condition():
                return
            if self.ended() and idle():  # nothing left to make `condition` true
                raise fail(ErrorType.LEARNER_FAILED, f"the learner ended {self._where()}")

    def _where(self) -> str:
        final = self.done.final if self.done is not None else None
        return f"at step {final.step} of {final.max_steps}" if final else "before its steps"

    async def cancel(self) -> None:
        """Cancel it, unless it has ended (it outlives the run that started it by design, not
        the training: the run cancels it as it fails or is cancelled). A cancel that finds no
        run (it continues as new, as a signal may: workflows/signals.py) is retried after each
        of `RETRY_DELAYS_S` until it goes through or the learner reports its end
        (`CANCEL_RETRY_PATCH`, asked after a failure); then the run goes on ending."""
        handle = workflow.get_external_workflow_handle(self.workflow_id)
        delays = iter(RETRY_DELAYS_S)
        while not self.ended():
            try:
                await handle.cancel()
                return
            except FailureError:  # no run now; or it ended meanwhile, or is gone for good
                delay = next(delays, None)
                if delay is None or self.ended() or not workflow.patched(CANCEL_RETRY_PATCH):
                    return
                workflow.logger.warning("cancel of %s found no run; retrying", self.workflow_id)
                with contextlib.suppress(asyncio.TimeoutError):  # its end reported: no wait
                    await workflow.wait_condition(self.ended, timeout=timedelta(seconds=delay))
