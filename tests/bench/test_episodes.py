"""bench/episodes.py's throughput part: which path it measures by default, the episodes it
plays, and the timing both paths share (rounds alternate, the warm-up is not counted)."""

from __future__ import annotations

import argparse
import asyncio
from types import SimpleNamespace
from typing import Any

import pytest


def test_the_default_path_is_agent_task_and_the_scripted_driver_stays_a_choice() -> None:
    from episodes import parse_args

    assert parse_args([]).path == "agent-task"  # what the 0.8x target is about
    assert parse_args(["--path", "scripted"]).path == "scripted"
    with pytest.raises(SystemExit):
        parse_args(["--path", "loop"])


def test_more_episodes_in_flight_than_exist_is_refused() -> None:
    from episodes import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--episodes", "4", "--concurrency", "8"])
    assert parse_args(["--episodes", "8", "--concurrency", "8"]).concurrency == 8


def test_every_episode_has_a_task_id_of_its_own_however_many_there_are() -> None:
    from episodes_common import episodes

    played = episodes(24)  # more than the suite's 19 tasks a third of the way apart
    assert len({e.spec.id for e in played}) == 24
    assert all(e.calls[-1].name == "submit" and len(e.calls) == 8 for e in played)
    assert played[0].spec.workspace == played[19].spec.workspace  # the same task, played again


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.cpu = {"server": 0.0, "bench": 0.0, "rest": 0.0}


def test_rounds_alternate_and_the_warm_up_is_neither_timed_nor_charged() -> None:
    from episodes_common import compare

    clock, order, tags = Clock(), list[str](), list[str]()

    def side(name: str, seconds: float, server_ms: float) -> object:
        async def run(tag: str) -> None:
            order.append(name)
            tags.append(tag)
            warm_up = len(order) <= 2
            clock.now += 100.0 if warm_up else seconds  # a slow first run must not count
            clock.cpu["server"] += (50.0 if warm_up else server_ms) * 100 / 1000

        return run

    report = asyncio.run(
        compare(
            tempered=side("tempered", 4.0, 3.0),  # type: ignore[arg-type]
            plain=side("plain", 2.0, 1.0),  # type: ignore[arg-type]
            steps=100,
            rounds=3,
            cpu=lambda: dict(clock.cpu),
            clock=lambda: clock.now,
        )
    )
    assert order == ["plain", "tempered"] + ["plain", "tempered", "tempered", "plain"] + [
        "plain",
        "tempered",
    ]
    assert len(set(tags)) == len(tags)  # each run's workflow ids and keys are its own
    assert report["tempered_steps_per_s"] == 25.0 and report["plain_steps_per_s"] == 50.0
    assert report["ratio"] == 0.5 and report["target_ratio"] == 0.8
    assert report["rounds"] == {"tempered": [25.0, 25.0, 25.0], "plain": [50.0, 50.0, 50.0]}
    assert report["cpu_ms_per_step"]["tempered"]["server"] == 3.0
    assert report["cpu_ms_per_step"]["plain"] == {"server": 1.0, "bench": 0.0, "rest": 0.0}


def test_in_flight_holds_at_most_concurrency_episodes_at_once() -> None:
    from episodes_common import in_flight

    running, most = 0, 0

    async def one(n: int) -> int:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.001)
        running -= 1
        return n * n

    assert asyncio.run(in_flight(7, 3, one)) == [n * n for n in range(7)]
    assert most == 3


def test_both_paths_time_every_sample_of_every_scripted_step(monkeypatch: Any) -> None:
    import episodes_common

    seen: dict[str, Any] = {}

    async def compare(**kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs)
        return {"ratio": 1.0}

    monkeypatch.setattr(episodes_common, "compare", compare)
    played = episodes_common.episodes(3)
    args = argparse.Namespace(episodes=3, group_size=4, rounds=5)
    tempered, plain = object(), object()

    report = asyncio.run(
        episodes_common.measure(args, played, 1, tempered=tempered, plain=plain)  # type: ignore[arg-type]
    )

    assert report == {"ratio": 1.0}
    assert seen["steps"] == 3 * 4 * 8 and seen["rounds"] == 5  # 8 scripted calls an episode
    assert seen["tempered"] is tempered and seen["plain"] is plain and callable(seen["cpu"])


def test_the_sandbox_stack_uploads_the_trees_and_polls_the_workers_own_queue(
    monkeypatch: Any,
) -> None:
    import contextlib

    import episodes_common

    from contracts.names import Queue

    events: list[str] = []

    class Sessions:
        store = SimpleNamespace(put_bytes=lambda key, data: events.append(f"put {key}"))

        async def env_step(self, request: Any) -> Any: ...

    sessions = Sessions()
    plans = {Queue.SANDBOX: SimpleNamespace(activities=[sessions.env_step])}

    @contextlib.asynccontextmanager
    async def production_workers(settings: Any, queues: Any) -> Any:
        events.append(f"workers {[q.value for q in queues]}")
        yield "client", plans

    @contextlib.asynccontextmanager
    async def own_queue_worker(client: Any, plan: Any) -> Any:
        events.append("own queue polled")
        yield
        events.append("own queue stopped")

    import workers.runtime

    monkeypatch.setattr(episodes_common, "production_workers", production_workers)
    monkeypatch.setattr(episodes_common, "temporal_pid", lambda settings: 42)
    monkeypatch.setattr(workers.runtime, "own_queue_worker", own_queue_worker)
    played = episodes_common.episodes(1)

    async def run() -> None:
        async with episodes_common.sandbox_stack("settings", [Queue.SANDBOX], played) as stack:  # type: ignore[arg-type]
            assert stack == ("client", plans, sessions, 42)
            events.append("measured")

    asyncio.run(run())

    puts = [f"put {key}" for key in played[0].objects]
    assert events == [
        "workers ['sandbox']",
        *puts,
        "own queue polled",
        "measured",
        "own queue stopped",
    ]
