"""A workflow's cancellation, kept when the operation it interrupted completed anyway.

The SDK hands a cancel request to the operation the workflow is awaiting. When that operation
completes all the same (a signal that had already gone out), the cancellation is spent: the
workflow runs on as if it had never been asked. The learner did: cancelled while its step's
progress signal was out, it took more steps, then retried signals to its closed run for 31 s
(tests/workflows/test_training_run.py at the 10 ms pace: 5 runs of 6 on the dev server).
`signal_run` raises it again (`raise_if_cancelled`) once a signal is done. An activity the
cancel finds running fails with a cancelled `ActivityError` (the SDK's default, TRY_CANCEL);
`cancel_kept` tells a workflow that this failure is its own cancellation.

Histories of earlier releases, where a spent cancellation went unnoticed, replay as they were:
the check is behind `workflow.patched(CANCEL_PATCH)`, asked only once a cancel was requested.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow

CANCEL_PATCH = "tempered-keep-cancellation"


def cancel_kept() -> bool:
    """Whether this workflow was asked to cancel (and runs code that acts on it)."""
    return workflow.cancellation_reason() is not None and workflow.patched(CANCEL_PATCH)


def raise_if_cancelled() -> None:
    """Raise the cancellation this workflow was asked for, if it was."""
    if cancel_kept():
        raise asyncio.CancelledError(f"cancelled: {workflow.cancellation_reason() or 'no reason'}")
