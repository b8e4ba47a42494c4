"""Heartbeats of long activities, in one place.

    result = await heartbeating(self._generate(req))
    result = await heartbeating(asyncio.to_thread(work), details=progress.copy)
    outcomes = await heartbeating_each(req.items, self._one)

An activity that stops heartbeating for its `heartbeat_timeout` is retried elsewhere, so every
activity that can take longer than that (model loads, batched generation, sandbox runs, learner
steps) awaits its work through `heartbeating`. It beats every third of the activity's own
heartbeat timeout (contracts allow 1 s), at most every `MAX_EVERY_S`: the interval is derived
here, never set by the caller, so no caller can beat slower than its timeout needs.
Cancelling the activity cancels the work and waits (up to `CANCEL_GRACE_S`) until its cleanup
is done; a thread cannot be cancelled, so work in one runs on unless it is asked to stop (the
learner's step is: activities/learner.py).
`heartbeating_each` is the shape of a batch activity (one request, N items run concurrently):
the first item that fails cancels its siblings and its own error is what the activity raises
(`infra.aio.all_or_cancel`, which an activity whose items are one step of its work awaits
inside `heartbeating`).
Bounding concurrency is the caller's, around as much of an item's work as it needs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

from temporalio import activity

from infra.aio import all_or_cancel

T = TypeVar("T")
R = TypeVar("R")
CANCEL_GRACE_S = 10.0
"""How long a cancelled activity waits for its work to finish cleaning up before it ends."""
MAX_EVERY_S = 5.0
"""The longest wait between two heartbeats, however long the heartbeat timeout: a cancel reaches
an activity only with the server's answer to one (workers/learner.py sends them as often)."""


def heartbeat_every_s() -> float:
    """Seconds between the running activity's heartbeats: a third of its heartbeat timeout (a
    beat may be late, or one lost, before it times out), at most `MAX_EVERY_S`."""
    timeout = activity.info().heartbeat_timeout
    if not timeout:
        return MAX_EVERY_S
    return min(MAX_EVERY_S, timeout.total_seconds() / 3)


async def heartbeating(work: Awaitable[T], *, details: Callable[[], object] | None = None) -> T:
    """Await `work`, heartbeating `details()` (or nothing) every `heartbeat_every_s()` until
    it is done."""
    every_s = heartbeat_every_s()
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every_s)
            if done:
                return task.result()
            if details is None:
                activity.heartbeat()
            else:
                activity.heartbeat(details())
    finally:
        if not task.done():
            # Wait (bounded) for the cancelled work's cleanup (a sandbox Job's delete): an
            # activity that reports done while it still runs lets shutdown close its clients
            # under it. A thread is not waited for: cancelling its future ends the task at once.
            task.cancel()
            await asyncio.wait({task}, timeout=CANCEL_GRACE_S)
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: the error that ends the activity is the caller's


async def heartbeating_each(
    items: Iterable[T],
    work: Callable[[T], Coroutine[Any, Any, R]],
    *,
    details: Callable[[], object] | None = None,
) -> list[R]:
    """`work` on every item concurrently, heartbeating as `heartbeating` does; the results in
    the items' order. The first item that fails cancels its siblings (the whole attempt is
    retried, and a retry must not race this attempt's leftovers) and its error is raised as it
    is (`all_or_cancel`)."""
    return await heartbeating(all_or_cancel(work(item) for item in items), details=details)
