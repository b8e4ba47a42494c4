"""Work in a thread that a cancel does not cut short: `in_thread`.

    data = await in_thread(read_tree, path)     # a cancel is raised once read_tree has ended

A thread cannot be stopped, so a coroutine cancelled while it awaits one would let go of what it
holds (a session's lock, a directory) while the thread still works on it. The session host and
the workspace environment run every disk operation on a session through `in_thread`, so a lock
held around it is held until the disk work is done. Not covered: work that never ends (the
cancel then waits for ever; the operations run here are bounded by their trees' quotas).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def in_thread(func: Callable[..., T], /, *args: object) -> T:
    """`asyncio.to_thread(func, *args)`, whose cancel is raised only once the thread has ended
    (its outcome then dropped): a lock held around it is held until its disk work is done."""
    thread = asyncio.ensure_future(asyncio.to_thread(func, *args))
    cancel: asyncio.CancelledError | None = None
    while not thread.done():
        try:
            await asyncio.shield(thread)
        except asyncio.CancelledError as exc:  # again and again: the thread goes on all the same
            cancel = cancel or exc
        except Exception:  # the thread's own: raised by `result` below
            break
    if cancel is not None:
        if not thread.cancelled():
            thread.exception()  # retrieved: the cancel wins
        raise cancel
    return thread.result()
