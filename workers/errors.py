"""One readable line for the errors a user can cause or fix (bad address, stack down, …)."""

from __future__ import annotations


def describe(err: BaseException) -> str:
    """A one-line explanation of `err`, with the fix where one is known."""
    text = str(err).strip() or type(err).__name__
    name = type(err).__name__
    if name == "RPCError" or "Connection refused" in text or "transport error" in text.lower():
        return f"cannot reach Temporal ({text.splitlines()[0]}); is the stack up? run `tempered up`"
    if name == "WorkflowFailureError" and err.__cause__ is not None:
        return f"workflow failed: {describe(err.__cause__)}"
    if name == "ApplicationError" and err.__cause__ is not None:
        return f"{text}: {describe(err.__cause__)}"
    return text.splitlines()[0] if len(text.splitlines()) == 1 else text
