"""`heartbeating` and `heartbeating_each` in an activity context: results and errors pass through,
heartbeats flow while the work runs, as often as the activity's heartbeat timeout needs, and a
cancelled activity ends only once its work's cleanup is done (bounded by CANCEL_GRACE_S). On a
real server: tests/activities/test_retention.py."""

from __future__ import annotations

import asyncio
import time

import pytest
from temporalio.testing import ActivityEnvironment

from activities import heartbeat
from activities.heartbeat import heartbeat_every_s, heartbeating, heartbeating_each
from tests.activities.heartbeats import timing_out_after


def test_the_interval_is_a_third_of_the_heartbeat_timeout_at_most_5s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every caller beat every 5 s (2 s for generate) whatever its timeout, which a run may set
    to 1 s: every activity longer than that timed out, and was retried for ever."""
    assert timing_out_after(1.5).run(heartbeat_every_s) == pytest.approx(0.5)
    assert timing_out_after(30).run(heartbeat_every_s) == heartbeat.MAX_EVERY_S == 5.0
    assert timing_out_after(None).run(heartbeat_every_s) == 5.0
    monkeypatch.setattr(heartbeat, "MAX_EVERY_S", 0.05)
    assert timing_out_after(30).run(heartbeat_every_s) == 0.05


@pytest.mark.asyncio
async def test_the_result_and_heartbeats_of_the_work() -> None:
    beats: list[tuple[object, ...]] = []
    env = timing_out_after(0.03)
    env.on_heartbeat = lambda *details: beats.append(details)

    async def work() -> int:
        await asyncio.sleep(0.1)
        return 7

    assert await env.run(heartbeating, work(), details=lambda: "busy") == 7
    assert len(beats) >= 3 and set(beats) == {("busy",)}


@pytest.mark.asyncio
async def test_the_first_failing_item_is_raised_as_it_is() -> None:
    async def one(item: int) -> int:
        if item == 2:
            raise KeyError(item)
        await asyncio.sleep(0 if item != 3 else 10)  # item 3 is cancelled by item 2's failure
        return item

    with pytest.raises(KeyError):
        await ActivityEnvironment().run(heartbeating_each, range(4), one)
    assert await ActivityEnvironment().run(heartbeating_each, [0, 1], one) == [0, 1]


@pytest.mark.asyncio
async def test_a_cancelled_activity_ends_after_its_works_cleanup() -> None:
    """Cancelling only requested the work's end: the activity reported done while its cleanup
    (a sandbox Job's delete) still ran, and a worker shutting down closed the API client under
    it."""
    started, cleaned = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.2)  # the cleanup: an API call
            cleaned.set()

    env = ActivityEnvironment()
    activity = asyncio.create_task(env.run(heartbeating, work()))
    await started.wait()
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await activity
    assert cleaned.is_set()


@pytest.mark.asyncio
async def test_the_wait_for_cleanup_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heartbeat, "CANCEL_GRACE_S", 0.2)
    started, released = asyncio.Event(), asyncio.Event()

    async def stubborn() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.shield(released.wait())  # a cleanup that does not end in time

    env = ActivityEnvironment()
    activity = asyncio.create_task(env.run(heartbeating, stubborn()))
    await started.wait()
    began = time.monotonic()
    env.cancel()
    with pytest.raises(asyncio.CancelledError):
        await activity
    assert 0.15 < time.monotonic() - began < 1.0
    released.set()
    await asyncio.sleep(0.01)
