"""One readable line for the errors a user can cause or fix (bad address, stack down, a
namespace the server lacks, a value out of bounds, …), the argparse types that refuse bad input
at parse time, and the quiet SDK runtime of a command's client (`quiet_runtime`)."""

from __future__ import annotations

import argparse
import math
import re

from pydantic import ValidationError
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError
from temporalio.service import RPCError, RPCStatusCode

from contracts.common import describe_validation_error, is_identifier
from workers.runtime import TemporalUnreachable

TEMPORAL_PORT_HINT = "check the address: a Temporal frontend's gRPC port (7233 by default)"


UNREACHABLE = frozenset({RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED})
"""The statuses of a call that no Temporal answered (it went away, or never replied in time)."""


def describe(err: BaseException) -> str:
    """A one-line explanation of `err`, with the fix where one is known."""
    text = str(err).strip() or type(err).__name__
    cause = err.__cause__
    if isinstance(err, TemporalUnreachable):
        return _unreachable(err)
    if isinstance(err, RPCError) and err.status is RPCStatusCode.NOT_FOUND:
        return _not_found(text.splitlines()[0])  # it answered: it is reached
    if (
        isinstance(err, RPCError)
        and err.status in UNREACHABLE
        or "Connection refused" in text
        or "transport error" in text.lower()
    ):
        return f"cannot reach Temporal ({text.splitlines()[0]}); is the stack up? run `tempered up`"
    if isinstance(err, RPCError):  # it answered: a permission refused is no stack down
        return f"Temporal answered {err.status.name} ({err.message.strip() or 'no message'})"
    if isinstance(err, WorkflowFailureError) and cause is not None:
        return f"workflow failed: {describe(cause)}"
    if isinstance(err, ActivityError) and cause is not None:
        return f"activity {err.activity_type} failed: {describe(cause)}"
    if isinstance(err, ChildWorkflowError) and cause is not None:
        return f"{err.workflow_type} failed: {describe(cause)}"
    if isinstance(err, ApplicationError) and cause is not None:
        inner = describe(cause)
        return text if inner.split(": ", 1)[-1] in text else f"{text}: {inner}"
    if isinstance(err, ValidationError):  # pydantic's own text is a dozen lines and a URL
        return f"{err.title}: {describe_validation_error(err)}"
    return text.splitlines()[0] if len(text.splitlines()) == 1 else text


def _unreachable(err: TemporalUnreachable) -> str:
    """Why no Temporal answered at the address, as the SDK's words tell: a server that took
    the connection and said nothing (a hung one, a proxy to nothing: the SDK gives up after
    ~30 s with "Timeout expired"), an HTTP server that is not a gRPC frontend (the UI's port, a
    web server: "grpc-status header missing, mapped from HTTP status code 404"), or none at all
    (refused, no route: the stack is down)."""
    said = str(err).splitlines()[0]
    where = f"cannot reach Temporal at {err.address}"
    if "Timeout expired" in said:
        return f"{where}: it took the connection but sent no answer in time; {TEMPORAL_PORT_HINT}"
    if http := re.search(r"HTTP status code (\d+)", said):
        return (
            f"{where}: an HTTP server answered (HTTP {http[1]}), not a Temporal gRPC frontend; "
            f"{TEMPORAL_PORT_HINT}, not the Web UI's or the HTTP API's"
        )
    return f"{where} ({said}); is the stack up? run `tempered up`"


def _not_found(text: str) -> str:
    """What Temporal's NotFound says: a namespace the server does not have ("Namespace other is
    not found."; it read "cannot reach Temporal …; is the stack up?", and `up` said the stack
    ran), or whatever else it did not find."""
    if "namespace" not in text.lower():
        return f"Temporal answered: not found ({text})"
    return (
        f"Temporal has no namespace ({text}): it answers, but does not have the one these "
        "settings name; set TEMPERED_TEMPORAL__NAMESPACE to one it has, or create it (`temporal "
        "operator namespace create NAME`; the embedded server makes its namespace when `tempered "
        "up` starts it)"
    )


def _whole(text: str, least: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} is not {what}")
    return value


def positive(text: str) -> int:
    """An argparse type: a whole number ≥ 1 (a count of tasks, repeats, slots)."""
    return _whole(text, 1, "a positive number")


def natural(text: str) -> int:
    """An argparse type: a whole number ≥ 0 (a sample index, versions to keep)."""
    return _whole(text, 0, "0 or more")


def number(text: str) -> float:
    """An argparse type: a finite number (seconds, a budget). `float` took `nan` and `inf`:
    `--time-budget nan` was then reported as "should be greater than or equal to 0", and
    `inf` passed as no limit at all."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (a finite one, e.g. 30)")
    return value


def run_id(text: str) -> str:
    """An argparse type: a run id as `contracts.common.Identifier` spells one (letters, digits,
    `_ . -`; not empty). `--attach ""` started a new default run, and an empty id is the prefix
    of every run."""
    if not is_identifier(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a run id (letters, digits, '_', '.', '-'; at most 128)"
        )
    return text
