"""`infra.aio.all_or_cancel`: results in order; the first work that fails cancels the others
in flight (observed in each sibling, and their cleanup done before it returns) and its own
error is raised, not an ExceptionGroup. Its users: tests/infra/inference/test_row_failures.py,
tests/activities/test_heartbeat.py."""

from __future__ import annotations

import asyncio

import pytest

from infra.aio import all_or_cancel


@pytest.mark.asyncio
async def test_the_results_in_the_works_order() -> None:
    async def one(item: int) -> int:
        await asyncio.sleep(0.01 * (3 - item))  # the last finishes first
        return item

    assert await all_or_cancel(one(item) for item in range(4)) == [0, 1, 2, 3]
    assert await all_or_cancel([]) == []


@pytest.mark.asyncio
async def test_the_first_failure_cancels_its_siblings_after_their_cleanup() -> None:
    running, cleaned = asyncio.Event(), list[int]()

    async def sibling(item: int) -> int:
        running.set()
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.01)  # the cleanup: an abort sent to the engine
            cleaned.append(item)
        return item

    async def failing() -> int:
        await running.wait()
        raise KeyError("row 0")

    with pytest.raises(KeyError, match="row 0"):
        await asyncio.wait_for(all_or_cancel([failing(), sibling(1), sibling(2)]), timeout=10)
    assert sorted(cleaned) == [1, 2]
