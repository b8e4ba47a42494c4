"""Heartbeats of long activities, in one place.

    result = await heartbeating(self._generate(req), every_s=2.0)
    result = await heartbeating(asyncio.to_thread(work), every_s=5.0, details=lambda: dict(progress))

An activity that stops heartbeating for its `heartbeat_timeout` is retried elsewhere, so every
activity that can take longer than that (model loads, batched generation, sandbox runs, learner
steps) awaits its work through `heartbeating`. Cancelling the activity cancels the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from temporalio import activity

T = TypeVar("T")


async def heartbeating(
    work: Awaitable[T], *, every_s: float, details: Callable[[], object] | None = None
) -> T:
    """Await `work`, heartbeating `details()` (or nothing) every `every_s` until it is done."""
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
        task.cancel()
