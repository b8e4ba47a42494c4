"""Signals between the two long-lived workflows (`TrainingRunWorkflow` and its
`LearnerWorkflow`), which find each other by workflow id and both continue as new.

A signal to a workflow id goes to its current run. While that run continues as new, a signal
can find no run: measured on the time-skipping test server in the 20,000-task test, where a
mid-run `add_groups` failed with `ExternalWorkflowExecutionNotFound` and failed the training
run with it. `signal_run` retries such a signal after 1, 2, 4, 8 and 16 s (a few events each),
unless the caller says the target is gone for good (`gone`: the learner already reported
`learner_done`), then raises. A caller asked to cancel while a signal was out is cancelled when
the signal is done, sent or not (`workflows.cancellation`).

Histories of the previous release, where a failed signal failed the workflow, replay as they
were: the retry is behind `workflow.patched(SIGNAL_RETRY_PATCH)`, asked only after a failure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    from contracts.names import Signal
    from workflows.cancellation import raise_if_cancelled

SIGNAL_RETRY_PATCH = "tempered-signal-retry"
RETRY_DELAYS_S = (1, 2, 4, 8, 16)
"""Waits before each retry of a signal that found no run (31 s in all)."""


def _never() -> bool:
    return False


async def signal_run(
    workflow_id: str,
    signal: Signal,
    args: Sequence[Any] = (),
    *,
    gone: Callable[[], bool] = _never,
) -> bool:
    """Signal the current run of `workflow_id`; False when it failed and `gone()` says the
    target ended for good (nothing to deliver), raises once the retries are spent."""
    handle, delays = workflow.get_external_workflow_handle(workflow_id), iter(RETRY_DELAYS_S)
    while True:
        try:
            await handle.signal(signal, args=list(args))
        except FailureError:
            if gone():
                return False
            raise_if_cancelled()  # no retries for a caller asked to end
            delay = next(delays, None)
            if delay is None or not workflow.patched(SIGNAL_RETRY_PATCH):
                raise
            workflow.logger.warning("signal %s to %s found no run; retrying", signal, workflow_id)
            await workflow.sleep(timedelta(seconds=delay))
        else:
            raise_if_cancelled()  # the signal went out all the same: it spent the caller's cancel
            return True
