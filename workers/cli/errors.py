"""One readable line for the errors a user can cause or fix (bad address, stack down, …)."""

from __future__ import annotations

import argparse

from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError
from temporalio.service import RPCError


def describe(err: BaseException) -> str:
    """A one-line explanation of `err`, with the fix where one is known."""
    text = str(err).strip() or type(err).__name__
    cause = err.__cause__
    if (
        isinstance(err, RPCError)
        or "Connection refused" in text
        or "transport error" in text.lower()
    ):
        return f"cannot reach Temporal ({text.splitlines()[0]}); is the stack up? run `tempered up`"
    if isinstance(err, WorkflowFailureError) and cause is not None:
        return f"workflow failed: {describe(cause)}"
    if isinstance(err, ActivityError) and cause is not None:
        return f"activity {err.activity_type} failed: {describe(cause)}"
    if isinstance(err, ChildWorkflowError) and cause is not None:
        return f"{err.workflow_type} failed: {describe(cause)}"
    if isinstance(err, ApplicationError) and cause is not None:
        inner = describe(cause)
        return text if inner.split(": ", 1)[-1] in text else f"{text}: {inner}"
    return text.splitlines()[0] if len(text.splitlines()) == 1 else text


def positive(text: str) -> int:
    """An argparse type: a whole number ≥ 1 (a count of tasks, repeats, slots)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return value
