"""`tempered down` while another process (not Temporal) holds Temporal's port: it waited ASK_S
(10 s) for the SDK's connect, which speaks HTTP/2 to a listener that never answers (the SDK's
own timeout is 30 s), before it stopped anything. It now tells in a second that nothing there
speaks gRPC, says it cannot tell which runs run, and stops the stack as before. Real
`stop_workers` and `stack.down` in a scratch home where nothing runs."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.processes import free_port
from infra.settings import Settings, TemporalSettings
from workers.cli import run


@pytest.fixture
def squatter() -> Iterator[int]:
    """A port (of the repo's range) where a plain TCP listener accepts and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", free_port()))
        listener.listen()
        yield listener.getsockname()[1]


def test_down_with_a_squatter_on_temporals_port_stops_at_once(
    squatter: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    temporal = TemporalSettings(address=f"127.0.0.1:{squatter}")
    settings = Settings(home=tmp_path / "home", config=None, temporal=temporal)
    started = time.monotonic()
    assert run(["down"], settings) == 0
    took = time.monotonic() - started
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [
        "codec: was not running",
        "temporal: was not running",
        "seaweedfs: was not running",
    ]
    assert captured.err.startswith("tempered down: cannot tell which runs run")
    assert took < 3, f"`down` took {took:.1f}s"
    assert f"127.0.0.1:{squatter} does not answer as a gRPC server" in captured.err
