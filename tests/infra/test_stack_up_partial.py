"""A `tempered up` that fails leaves nothing of its own running. It started Temporal before it
checked SeaweedFS's ports: on a taken S3 port it said only that port, and exit 1, leaving the
dev server it had just started running, its "temporal: started" line never printed. Now every
service's ports are checked before any starts; a start that fails all the same stops what this
`up` started (and says so), not what an earlier one did; each line is printed as it comes.

Real `tempered up` processes (their ports below the ephemeral range, a home under tmp_path); the
earlier `up`'s Temporal in the last test is a stand-in under its pidfile."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from infra import stack
from infra.processes import wait_for_port
from tests.fixtures.stack import Stack

LISTEN = """
import socket, sys, time
servers = [socket.create_server(("127.0.0.1", int(port))) for port in sys.argv[1:]]
time.sleep(300)
"""
"""A stand-in server: listens on every port in argv for 300 s, answering nothing."""


@pytest.fixture
def unstarted(tmp_path: Path) -> Iterator[Stack]:
    """A stack's settings and environment, nothing started; whatever runs at the end is stopped."""
    home = tmp_path / "home"
    assert home.name == "home" and tmp_path in home.parents
    unstarted = Stack(home)
    yield unstarted
    unstarted.tempered("down", "--force")


def dev_servers_of(home: Path) -> list[psutil.Process]:
    """Live Temporal dev servers on this home's database."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            mine = str(home / "temporal.db") in (process.info["cmdline"] or [])
            if mine and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def all_stopped(unstarted: Stack) -> None:
    status = unstarted.tempered("status")
    for service in ("temporal", "s3", "codec"):
        assert any(
            line.split()[:2] == [service, "stopped"] for line in status.stdout.splitlines()
        ), status.stdout


def test_a_taken_seaweed_port_starts_nothing(unstarted: Stack) -> None:
    s3 = stack.s3_endpoint(unstarted.settings)
    assert s3 is not None
    s3_port = s3.port
    with socket.create_server(("127.0.0.1", s3_port)):
        up = unstarted.tempered("up")
    assert up.returncode == 1, up.stdout + up.stderr
    assert f"port 127.0.0.1:{s3_port} (SeaweedFS) is taken by another process" in up.stderr
    assert "Traceback" not in up.stderr
    assert dev_servers_of(unstarted.home) == [], up.stdout
    assert stack.temporal_service(unstarted.settings).pid() is None
    all_stopped(unstarted)


def test_a_failed_start_stops_what_this_up_started(unstarted: Stack) -> None:
    (unstarted.home / "seaweed").parent.mkdir(parents=True)
    (unstarted.home / "seaweed").write_text("a file where SeaweedFS keeps its data")
    up = unstarted.tempered("up")
    assert up.returncode == 1, up.stdout + up.stderr
    assert up.stdout.startswith("temporal: started at"), up.stdout  # said as it started
    assert "SeaweedFS" in up.stderr and "stopped what this `up` started: temporal" in up.stderr
    assert "Traceback" not in up.stderr
    assert dev_servers_of(unstarted.home) == []
    all_stopped(unstarted)


def test_what_an_earlier_up_started_is_left_running(unstarted: Stack) -> None:
    settings = unstarted.settings
    settings.home.mkdir(parents=True)
    (settings.home / "seaweed").write_text("a file where SeaweedFS keeps its data")
    earlier = stack.temporal_service(settings)
    grpc = stack.temporal_endpoint(settings).port
    earlier.start([sys.executable, "-c", LISTEN, str(grpc), str(settings.temporal.ui_port)])
    record = json.loads(earlier.pidfile.read_text())
    earlier.pidfile.write_text(json.dumps({**record, "argv": stack.temporal_command(settings)}))
    wait_for_port("127.0.0.1", grpc, 10, earlier)
    pid = earlier.pid()
    said: list[str] = []
    with pytest.raises(stack.StackError) as failed:
        stack.up(settings, say=said.append)
    assert said == [f"temporal: already running at {stack.temporal_endpoint(settings)}"]
    assert "stopped what this `up` started" not in str(failed.value)
    assert earlier.pid() == pid is not None
    psutil.Process(pid).kill()  # the stand-in answers no `down` (it would wait 10 s for it)
