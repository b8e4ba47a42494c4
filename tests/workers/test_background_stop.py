"""`stop_workers` (`tempered down`) and a restart give each worker its drain before SIGKILL, and
stop the workers at once, not one after another; a rotated secret (`s3.secret_key`) restarts
the workers, though the pidfiles that record their settings never hold it. The workers here
are stand-ins for `tempered worker QUEUE`."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from contracts.names import Queue
from infra.processes import Service, free_port
from infra.settings import Settings, TemporalSettings
from workers.background import (
    RECONFIGURED,
    drain_s,
    ensure_workers,
    stop_workers,
    worker_service,
)

DRAINER = """
import signal, sys, time
def drain(*_):
    time.sleep(float(sys.argv[1]))  # the activities in flight finish
    print("drained", flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, drain)
print("ready", flush=True)
time.sleep(60)
"""


def no_temporal() -> TemporalSettings:  # noqa: N802
    """Where no Temporal answers: no worker polling the default address's queues counts."""
    return TemporalSettings(address=f"127.0.0.1:{free_port()}")


def drainer(queue: Queue) -> list[str]:
    return [sys.executable, "-c", DRAINER, "1", queue.value]


def quick(queue: Queue) -> list[str]:
    return [sys.executable, "-c", DRAINER, "0", queue.value]


@pytest.fixture
def settings(tmp_path: Path) -> Iterator[Settings]:
    settings = Settings(home=tmp_path, temporal=no_temporal())
    yield settings
    stop_workers(settings)


def started(settings: Settings, command: Callable[[Queue], list[str]] = drainer) -> None:
    ensure_workers(settings, command)
    for queue in Queue:
        deadline = time.monotonic() + 10
        while "ready" not in worker_service(settings, queue).log_tail():
            assert time.monotonic() < deadline, queue
            time.sleep(0.02)


@pytest.fixture
def timeouts(monkeypatch: pytest.MonkeyPatch) -> dict[str, float]:
    """Service name → the timeout its last `stop` was given (the stop itself runs)."""
    given: dict[str, float] = {}
    stop = Service.stop

    def recorded(self: Service, *args: Any, **kwargs: Any) -> bool:
        given[self.name] = kwargs.get("timeout_s", args[0] if args else 15.0)
        return stop(self, *args, **kwargs)

    monkeypatch.setattr(Service, "stop", recorded)
    return given


def drain_of(queue: Queue) -> float:
    """What the queue's worker plan gives its activities in flight after SIGTERM (a plan takes
    it from `drain_s`: tests/workers/test_background_drains.py)."""
    return drain_s(queue)


def test_down_gives_each_worker_its_drain(settings: Settings, timeouts: dict[str, float]) -> None:
    """`tempered down` SIGKILLed a learner 40 s into its 270 s drain: the step in flight was
    lost (and redone), and `down` said "stopped"."""
    started(settings)
    assert stop_workers(settings) == [f"worker {q.value}: stopped" for q in Queue]
    for queue in Queue:
        assert timeouts[worker_service(settings, queue).name] > drain_of(queue), queue
        assert "drained" in worker_service(settings, queue).log_tail(), queue


def test_a_restart_gives_each_worker_its_drain(
    settings: Settings, timeouts: dict[str, float]
) -> None:
    started(settings, quick)
    other = settings.model_copy(update={"s3": settings.s3.model_copy(update={"bucket": "other"})})
    ensure_workers(other, quick)
    for queue in Queue:
        assert timeouts[worker_service(settings, queue).name] > drain_of(queue), queue


def test_down_stops_the_workers_at_once(settings: Settings) -> None:
    """Each worker drains for 1 s here: one after another, `down` took five."""
    started(settings)
    began = time.monotonic()
    assert len(stop_workers(settings)) == len(Queue)
    assert time.monotonic() - began < 3


def with_secret(settings: Settings, secret: str) -> Settings:
    s3 = settings.s3.model_copy(update={"secret_key": SecretStr(secret)})
    return settings.model_copy(update={"s3": s3})


def test_a_rotated_secret_restarts_the_workers(settings: Settings) -> None:
    """A SecretStr dumps as '**********': the digest of the settings the workers started with
    missed a new `s3.secret_key`, and `tempered train` said "already running"."""
    ensure_workers(with_secret(settings, "old-secret-1f8e"), quick)
    lines = ensure_workers(with_secret(settings, "rotated-secret-9c2d"), quick)
    assert lines[::2] == [f"worker {q.value}: {RECONFIGURED}" for q in Queue], lines
    assert ensure_workers(with_secret(settings, "rotated-secret-9c2d"), quick) == [
        f"worker {q.value}: already running" for q in Queue
    ]
    for path in (settings.home / "run").iterdir():
        if path.suffix == ".pid":
            assert "secret" not in path.read_text(), path


def test_the_settings_digest_keys_its_secrets(settings: Settings) -> None:
    from workers.background import settings_digest

    old, new = with_secret(settings, "old-secret-1f8e"), with_secret(settings, "rotated-9c2d")
    assert settings_digest(old) != settings_digest(new)
    assert settings_digest(old) == settings_digest(with_secret(settings, "old-secret-1f8e"))
    key = next(path for path in (settings.home / "run").iterdir() if path.suffix == ".key")
    assert key.stat().st_mode & 0o077 == 0  # only its owner reads the key
