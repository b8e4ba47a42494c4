"""`run_workers` (workers/runtime.py) against a real Temporal dev server: its health files, which
the chart's probes read (workers/health.py), and its closes at shutdown.

The chart had no probes: a pod was Ready at container start while vLLM loaded for up to 900 s
(so a rolling update drained the old inference pod with nothing polling in its place), and a
worker whose event loop was wedged was never restarted. Now the ready file appears only once
every Worker polls, and the alive file is touched from the event loop, so it ages while the loop
is blocked. At shutdown one close that raised skipped the rest: the next plans' `on_shutdown`
and the telemetry's flush. The queues' plans are stand-ins (one trivial activity each).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.worker import Worker

from contracts.names import Queue
from infra.settings import Settings, TemporalSettings
from tests.fixtures.temporal import TemporalServer
from workers import health, runtime
from workers.health import Health, container_token
from workers.plan import WorkerPlan

WAIT_S = 30.0


@activity.defn(name="noop")
async def noop() -> None:
    pass


class Recorded(Worker):
    """The SDK's Worker, each one kept, to ask whether it runs."""

    made: list[Worker] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        Recorded.made.append(self)


@pytest.fixture
def settings(temporal_server: TemporalServer, namespace: str, tmp_path: Path) -> Settings:
    temporal = TemporalSettings(address=temporal_server.address, namespace=namespace)
    return Settings(home=tmp_path / "home", temporal=temporal)


def plans(monkeypatch: pytest.MonkeyPatch, made: dict[Queue, Callable[[], WorkerPlan]]) -> None:
    for queue, plan in made.items():

        def build(settings: Settings, plan: Callable[[], WorkerPlan] = plan) -> WorkerPlan:
            return plan()

        monkeypatch.setitem(runtime.BUILDERS, queue, build)


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"no {what} in {WAIT_S} s"
        await asyncio.sleep(0.01)


async def stopped(running: asyncio.Task[None]) -> None:
    """SIGTERM to this process (the workers' handler takes it), and their end."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # it would end the tests
        running.cancel()
        pytest.fail("the workers took no SIGTERM")
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(running, WAIT_S)


@pytest.mark.asyncio
async def test_ready_once_every_worker_polls_and_alive_only_while_the_loop_runs(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(health, "ALIVE_EVERY_S", 0.05)
    monkeypatch.setattr(runtime, "Worker", Recorded)
    Recorded.made = []
    files = Health(settings.home, "rewards+sandbox")
    files.ready.parent.mkdir(parents=True)
    files.ready.write_text(container_token())  # a dead worker's, in this container
    files.alive.touch()
    ready_at_build: list[bool] = []

    def plan() -> WorkerPlan:
        ready_at_build.append(files.ready.exists())
        return WorkerPlan(activities=[noop], drain_s=1.0)

    plans(monkeypatch, {Queue.REWARDS: plan, Queue.SANDBOX: plan})
    running = asyncio.create_task(runtime.run_workers([Queue.REWARDS, Queue.SANDBOX], settings))
    try:
        await until(lambda: len(ready_at_build) == 2, "plans")
        assert ready_at_build == [False, False]  # the dead worker's was removed at start
        await until(files.ready.exists, "ready file")
        assert len(Recorded.made) == 2 and all(w.is_running for w in Recorded.made)
        assert files.ready.read_text() == container_token()
        before = files.alive.stat().st_mtime_ns
        await until(lambda: files.alive.stat().st_mtime_ns > before, "touch while the loop runs")
        # no await from here to the end of the block: a touch meanwhile came from outside the
        # loop (a thread), however slow the host
        touched = files.alive.stat().st_mtime_ns
        time.sleep(0.5)  # the loop is blocked (a synchronous call in an activity, a deadlock)
        assert files.alive.stat().st_mtime_ns == touched, "touched while blocked"
        assert time.time_ns() - touched >= 0.5e9  # stale, as a liveness probe reads it
        await until(lambda: files.alive.stat().st_mtime_ns > touched, "touch after the block")
    finally:
        await stopped(running)
    assert not files.ready.exists() and not files.alive.exists()


@pytest.mark.asyncio
async def test_a_close_that_fails_leaves_the_others_to_run(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    closed: list[str] = []

    async def failing() -> None:
        closed.append("rewards")
        raise RuntimeError("the pool would not close")

    async def closing() -> None:
        closed.append("sandbox")

    plans(
        monkeypatch,
        {
            Queue.REWARDS: lambda: WorkerPlan(activities=[noop], on_shutdown=failing, drain_s=1),
            Queue.SANDBOX: lambda: WorkerPlan(activities=[noop], on_shutdown=closing, drain_s=1),
        },
    )
    real_setup = runtime.setup_telemetry

    def setup(*args: Any) -> Any:
        telemetry = real_setup(*args)
        flush = telemetry.shutdown

        def shutdown() -> None:
            closed.append("telemetry")
            flush()

        telemetry.shutdown = shutdown  # type: ignore[method-assign]
        return telemetry

    monkeypatch.setattr(runtime, "setup_telemetry", setup)
    monkeypatch.setattr(runtime, "Worker", Recorded)
    Recorded.made = []
    with caplog.at_level(logging.ERROR, logger="tempered.worker"):
        running = asyncio.create_task(runtime.run_workers([Queue.REWARDS, Queue.SANDBOX], settings))
        await until(lambda: [w.is_running for w in Recorded.made] == [True] * 2, "workers")
        await stopped(running)  # raises nothing: the failure is logged
    assert closed == ["rewards", "sandbox", "telemetry"]
    assert "the pool would not close" in caplog.text


@pytest.mark.asyncio
async def test_plans_built_before_a_connect_that_fails_are_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plans are built before the store check and the connect (so the check knows which
    use the store): a Temporal not there yet (a pod restarted until it is) left them open, the
    sandbox backend's sessions and the inference engine unclosed."""
    closed: list[str] = []

    async def closing() -> None:
        closed.append("rewards")

    plans(monkeypatch, {Queue.REWARDS: lambda: WorkerPlan(activities=[noop], on_shutdown=closing)})
    nobody = Settings(home=tmp_path / "home", temporal=TemporalSettings(address="127.0.0.1:9"))
    with pytest.raises(runtime.TemporalUnreachable):
        await runtime.run_workers([Queue.REWARDS], nobody)
    assert closed == ["rewards"]
