"""Concurrent work that succeeds or fails as one: the first failure cancels the rest.

    results = await all_or_cancel(submit(row) for row in rows)    # in order; or the first error

`asyncio.gather` leaves the other awaitables running when one fails: rows decoding for nobody,
their slots and KV held, while a retry of the whole attempt races them. `all_or_cancel` runs
the works in a task group, so the first that fails cancels its siblings and waits until their
cleanup is done (a vLLM row's `finally` aborts its request in the engine), then raises that
work's own error, not an ExceptionGroup: Temporal must see the item's typed error. Used
wherever sibling work is one attempt (a backend's rows, an activity's items:
`activities.heartbeat.heartbeating_each`). Not for work whose failures are each a result of
their own (use `gather(..., return_exceptions=True)` there).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

R = TypeVar("R")


async def all_or_cancel(works: Iterable[Coroutine[Any, Any, R]]) -> list[R]:
    """Every one of `works`, run concurrently; their results in order. The first that fails
    cancels the others and its error is raised as it is."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(work) for work in works]
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]
