"""`tempered down` while the stack's own Temporal (its pidfile's live process) holds its port and
does not answer in time, as a loaded host's may: `down` said "cannot tell which runs run" and
stopped the workers and the stack without --force, under a training run that may run. It now
refuses (exit 2, nothing stopped) and says --force stops it all the same; --force does.

The stack's Temporal is a real process started as `up` starts it (`Service.start`, its pidfile),
one that accepts connections on Temporal's port and never answers; `down` is the real command,
its wait for an answer (ASK_S) shortened."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import stack
from infra.processes import Service, free_port, port_open
from infra.settings import Settings, TemporalSettings
from workers.cli import run
from workers.cli import stack as stack_cli

SILENT = """
import socket, time
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", {port}))
listener.listen()
held = []
while True:
    held.append(listener.accept()[0])  # held open, never answered
"""


@pytest.fixture
def silent_temporal(tmp_path: Path) -> Iterator[tuple[Settings, Service]]:
    """Settings whose home's pidfile names a live process on Temporal's port that never answers."""
    port = free_port()
    temporal = TemporalSettings(address=f"127.0.0.1:{port}")
    settings = Settings(home=tmp_path / "home", config=None, temporal=temporal)
    service = stack.temporal_service(settings)
    assert service.home == tmp_path / "home"
    service.start([sys.executable, "-c", SILENT.format(port=port)])
    try:
        deadline = time.monotonic() + 20
        while not port_open("127.0.0.1", port):
            assert time.monotonic() < deadline, service.log_tail()
            time.sleep(0.1)
        yield settings, service
    finally:
        service.stop(timeout_s=5)


def test_down_refuses_while_its_own_temporal_cannot_be_asked(
    silent_temporal: tuple[Settings, Service],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings, service = silent_temporal
    monkeypatch.setattr(stack_cli, "ASK_S", 2.0)
    code = run(["down"], settings)
    captured = capsys.readouterr()
    assert code == 2, captured
    assert service.pid() is not None, "down stopped the stack's Temporal without --force"
    assert captured.out == ""
    err = " ".join(captured.err.split())
    assert "could not ask" in err and "no answer within 2s" in err, err
    assert "Nothing stopped" in err and "tempered down --force" in err, err


def test_down_force_stops_it_all_the_same(
    silent_temporal: tuple[Settings, Service],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings, service = silent_temporal
    monkeypatch.setattr(stack_cli, "ASK_S", 2.0)
    assert run(["down", "--force"], settings) == 0
    captured = capsys.readouterr()
    assert service.pid() is None
    assert "temporal: stopped" in captured.out.splitlines(), captured
    assert "could not ask" in " ".join(captured.err.split()), captured.err
