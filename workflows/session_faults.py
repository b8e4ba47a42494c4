"""What a failed activity on a sandbox worker's queue says of that worker (workflows/sessions.py).

    if session_lost(error): ...      # the worker is gone, or no longer holds the session
    if attempts_spent(error): ...    # its retryable fault outlasted `STEP_ATTEMPTS`

Workflow code: pure functions of the SDK's errors. Not covered: what the workflow then does.
"""

from __future__ import annotations

from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    RetryState,
    TimeoutError,
    TimeoutType,
)

from contracts.errors import ErrorType


def worker_gone(error: ActivityError) -> bool:
    """Whether an activity on a worker's own queue failed because no worker polls it."""
    cause = error.cause
    return isinstance(cause, TimeoutError) and cause.type is TimeoutType.SCHEDULE_TO_START


def session_lost(error: ActivityError) -> bool:
    """Whether a step failed because its session's worker is gone or no longer holds it."""
    cause = error.cause
    if worker_gone(error):
        return True
    return isinstance(cause, ApplicationError) and cause.type == ErrorType.SESSION_LOST


def attempts_spent(error: ActivityError) -> bool:
    """Whether a step failed because its retryable fault outlasted its attempts
    (`STEP_ATTEMPTS`): its worker keeps failing it."""
    return error.retry_state == RetryState.MAXIMUM_ATTEMPTS_REACHED
