"""`Service.stop`: SIGTERM to the service's leader alone (it drains, then ends its own children),
SIGKILL to its whole group only when it outlives its timeout; an exited service counts as
stopped even while a live parent leaves it a zombie. The services here are small stand-ins."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from infra.processes import Service

REPO = Path(__file__).resolve().parents[2]

CHILD = """
import signal, sys, time
from pathlib import Path
marker = Path(sys.argv[1])
def term(*_):
    marker.write_text("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, term if sys.argv[2] == "trap" else signal.SIG_IGN)
Path(str(marker) + ".ready").write_text("")
time.sleep(60)
"""

LEADER = """
import signal, subprocess, sys, time
from pathlib import Path
marker, on_term = Path(sys.argv[1]), sys.argv[2]
child = subprocess.Popen([sys.executable, "-c", sys.argv[3], str(marker), sys.argv[4]])
while not Path(str(marker) + ".ready").exists():
    time.sleep(0.01)
def drain(*_):
    time.sleep(0.5)  # the requests in flight finish: the child (an engine core) still serves
    print("child signalled during the drain:", marker.exists(), flush=True)
    child.terminate()
    child.wait()
    sys.exit(0)
handlers = {"drain": drain, "ignore": signal.SIG_IGN, "die": signal.SIG_DFL}
signal.signal(signal.SIGTERM, handlers[on_term])
print("ready child", child.pid, flush=True)
time.sleep(60)
"""


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(condition: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not callable(condition) or not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    service = Service("leader", tmp_path)
    yield service
    service.stop(timeout_s=1)


def start_leader(service: Service, on_term: str, child_term: str) -> int:
    """Start the stand-in leader (with a child in its process group); the child's pid."""
    marker = service.home / "child-signalled"
    with service.lock():
        service.start(
            [sys.executable, "-c", LEADER, str(marker), on_term, CHILD, child_term],
            env={"PATH": "/usr/bin:/bin"},
        )
    wait_until(lambda: "ready child" in service.log_tail())
    return int(service.log_tail().split("ready child")[1].split()[0])


def test_the_graceful_stop_signals_the_leader_alone(service: Service) -> None:
    """A vLLM engine core (the inference worker's child, in its group) aborts its requests at
    once on SIGTERM: a SIGTERM to the group left the worker's drain nothing to wait for."""
    child = start_leader(service, "drain", "trap")
    assert service.stop(timeout_s=10)
    assert "child signalled during the drain: False" in service.log_tail()
    assert gone(child)


def test_a_child_its_leader_left_behind_is_stopped_too(service: Service) -> None:
    child = start_leader(service, "die", "trap")
    assert service.stop(timeout_s=10)
    wait_until(lambda: gone(child))
    assert (service.home / "child-signalled").read_text() == "SIGTERM"


def test_a_leader_that_outlives_its_timeout_is_killed_with_its_group(service: Service) -> None:
    child = start_leader(service, "ignore", "ignore")
    started = time.monotonic()
    assert service.stop(timeout_s=0.5)
    assert time.monotonic() - started < 5
    wait_until(lambda: gone(child))
    assert service.pid() is None


def test_a_service_whose_parent_lives_on_is_stopped_at_once(tmp_path: Path) -> None:
    """`tempered down` stopping a worker that a `tempered train` still running started: the
    worker exits on SIGTERM at once, but stays a zombie of that live parent, and `stop` waited
    its whole timeout for it, then SIGKILL, then 5 s more."""
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from infra.processes import Service\n"
            "service = Service('w', Path(sys.argv[1]))\n"
            "with service.lock(): service.start(['sleep', '600'])\n"
            "time.sleep(60)",
            str(tmp_path),
        ],
        cwd=REPO,
    )
    try:
        service = Service("w", tmp_path)
        wait_until(lambda: service.pid() is not None)
        pid = service.pid()
        assert pid is not None
        started = time.monotonic()
        assert service.stop(timeout_s=6)
        assert time.monotonic() - started < 1
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # its parent never reaped
        assert service.pid() is None
    finally:
        parent.kill()
        parent.wait()
