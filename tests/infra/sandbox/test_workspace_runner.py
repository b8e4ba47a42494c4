"""Commands over a workspace (infra/sandbox/workspace.py), on real bwrap and cgroups: the
workspace is read-write at its workdir and nothing else of the host is, every limit holds,
there is no network, and nothing is left behind (processes, cgroups). The start-up probe
(`CommandRunner.probe`) passes here, reports what bwrap (or setpriv) said where the sandbox
cannot come up, and condemns nothing for a sandbox that does not answer in time."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.cgroups import CGROUP_ROOT, Cgroups, sweep_dead_workers
from infra.sandbox.workspace import (
    PROBE_TRIES,
    SESSION_UID_BASE,
    SLOTS,
    CommandRunner,
    Mounts,
    cgroup_name,
    check_mount_point,
    session_uid,
)

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bwrap and root"
)
SLOT = 7
LIMITS = SandboxLimits(
    timeout_s=5, max_processes=16, output_bytes=1000, file_size_mb=1, memory_mb=64
)


@pytest.fixture
def workspace() -> Iterator[Path]:
    parent = Path(tempfile.mkdtemp(prefix="tempered-test-runner-"))
    parent.chmod(0o711)
    ws = parent / "ws"
    ws.mkdir(mode=0o700)
    os.chown(ws, session_uid(SLOT), session_uid(SLOT))
    (ws / "hello.txt").write_text("hello\n")
    yield ws
    shutil.rmtree(parent)


def run(workspace: Path, command: str, limits: SandboxLimits = LIMITS, **mounts: object):  # type: ignore[no-untyped-def]
    runner = CommandRunner()
    spec = Mounts(workspace, **mounts)  # type: ignore[arg-type]
    return asyncio.run(runner.run(command, spec, session_uid(SLOT), limits, cgroup_name(SLOT)))


def test_a_command_sees_its_workspace_at_the_workdir_and_writes_only_there(workspace: Path) -> None:
    result = run(
        workspace,
        "pwd; cat hello.txt; echo $GREETING > out.txt; id -u; touch /usr/x",
        workdir="/srv/app",
        env={"GREETING": "hi"},
    )
    assert result.status is ExecStatus.FAILED and result.exit_code == 1  # `touch /usr/x` failed
    assert result.stdout.splitlines() == ["/srv/app", "hello", "1000"]
    assert "Read-only file system" in result.stderr
    assert (workspace / "out.txt").read_text() == "hi\n"
    assert (workspace / "out.txt").stat().st_uid == session_uid(SLOT)


def test_exit_codes_and_the_deadline(workspace: Path) -> None:
    assert run(workspace, "exit 3").exit_code == 3
    assert run(workspace, "true").status is ExecStatus.PASSED
    slow = run(workspace, "sleep 30 & sleep 30", LIMITS.model_copy(update={"timeout_s": 1}))
    assert slow.status is ExecStatus.TIMEOUT and "deadline" in slow.detail
    assert slow.duration_ms < 5000


def test_no_network_and_no_host_files(workspace: Path) -> None:
    result = run(
        workspace,
        "cat /etc/shadow; ls /root; python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 1)'",
    )
    assert result.status is ExecStatus.FAILED
    assert "No such file" in result.stderr and "Network is unreachable" in result.stderr


def test_memory_processes_output_and_file_size_are_limited(workspace: Path) -> None:
    memory = run(workspace, "python3 -c 'x = bytearray(300 << 20)'")
    assert memory.status is ExecStatus.MEMORY_EXCEEDED
    forks = run(
        workspace,
        "for i in $(seq 40); do sleep 5 & done; wait",
        LIMITS.model_copy(update={"timeout_s": 3}),
    )
    assert "fork" in forks.stderr.lower() or "resource" in forks.stderr.lower()
    loud = run(workspace, "yes | head -c 100000")
    assert loud.truncated and len(loud.stdout) == LIMITS.output_bytes
    big = run(workspace, "head -c 3000000 /dev/zero > big.bin")
    assert big.status is ExecStatus.FAILED and (workspace / "big.bin").stat().st_size <= 1 << 20


@pytest.mark.parametrize("hog", ["while :; do :; done", "exec python3 -c 'while True: pass'"])
def test_the_cpu_limit_is_a_timeout_even_for_the_commands_own_shell(
    workspace: Path, hog: str
) -> None:
    limits = LIMITS.model_copy(update={"cpu_s": 1, "timeout_s": 10})
    result = run(workspace, hog, limits)
    assert (result.status, result.detail) == (ExecStatus.TIMEOUT, "CPU limit of 1s"), result
    assert result.duration_ms < 5000


def test_the_process_and_file_size_limits_hold_to_the_unit(workspace: Path) -> None:
    """`max_processes` counts the command's shell and everything it starts; `file_size_mb` is
    the largest file it may write, to the byte."""
    many = "for i in $(seq {}); do sleep 0.3 & done; wait"
    assert run(workspace, many.format(LIMITS.max_processes - 1)).status is ExecStatus.PASSED
    over = run(workspace, many.format(LIMITS.max_processes))
    assert over.status is ExecStatus.FAILED and "fork" in over.stderr.lower()
    size = LIMITS.file_size_mb << 20
    assert run(workspace, f"head -c {size} /dev/zero > max.bin").status is ExecStatus.PASSED
    assert (workspace / "max.bin").stat().st_size == size
    over = run(workspace, f"head -c {size + 1} /dev/zero > over.bin")
    assert over.status is ExecStatus.FAILED and (workspace / "over.bin").stat().st_size == size


def test_a_mount_the_host_cannot_make_is_a_platform_fault(workspace: Path) -> None:
    with pytest.raises(SandboxInfraError, match="failed to set up: bwrap: Can't find source"):
        run(workspace, "true", extra=((Path("/nonexistent/tempered"), "/data", False),))


def test_session_uids_never_overlap_between_workers_or_slots() -> None:
    """A dead worker's uids are swept by range: no uid of a live worker may lie in it."""
    pids = (99, 100, 101)
    uids = [session_uid(slot, pid) for pid in pids for slot in range(SLOTS)]
    assert len(set(uids)) == len(uids)
    assert (min(uids), max(uids)) == (
        SESSION_UID_BASE + 99 * SLOTS,
        SESSION_UID_BASE + 102 * SLOTS - 1,
    )
    for slot in (-1, SLOTS):
        with pytest.raises(ValueError, match=f"outside 0..{SLOTS - 1}"):
            session_uid(slot)
    assert cgroup_name(3, pid=99) == "99-w3" and cgroup_name(3) == f"{os.getpid()}-w3"


@pytest.mark.skipif(not Cgroups.available(), reason="needs cgroup v1 controllers")
def test_a_dead_workers_command_cgroups_are_swept_with_what_runs_in_them() -> None:
    gone = psutil.Popen(["true"])
    gone.wait()
    cgroups = Cgroups.create(cgroup_name(3, pid=gone.pid))
    left = psutil.Popen(["sleep", "60"])  # what a command of the dead worker left running
    try:
        for procs in cgroups.procs_files():
            procs.write_text(str(left.pid))
        assert sweep_dead_workers(gone.pid) == 1
        assert left.wait(5) == -9
        assert not any(path.exists() for path in cgroups.paths.values())
        assert sweep_dead_workers(gone.pid) == 0
    finally:
        if left.poll() is None:
            left.kill()


def test_nothing_is_left_behind(workspace: Path) -> None:
    run(workspace, "sleep 60 & sleep 60 & echo started", LIMITS.model_copy(update={"timeout_s": 1}))
    uid = session_uid(SLOT)
    assert not [
        p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid
    ]
    if Cgroups.available():
        assert not any(
            (CGROUP_ROOT / ctl / "tempered" / cgroup_name(SLOT)).exists()
            for ctl in ("memory", "pids")
        )


@pytest.mark.parametrize("path", ["/", "/usr/lib", "/proc/x", "relative", "/app/../etc"])
def test_mount_points_inside_the_system_are_refused(path: str) -> None:
    with pytest.raises(ValueError):
        check_mount_point(path)


def rejected_option(monkeypatch: pytest.MonkeyPatch, tries: int = PROBE_TRIES) -> list[str]:
    """Make bwrap itself refuse the next `tries` sandboxes (an option it does not know), as a
    host whose bwrap cannot create its namespaces does; returns the commands asked for."""
    asked: list[str] = []
    build = CommandRunner.argv

    def argv(self: CommandRunner, command: str, *args: Any) -> list[str]:
        line = build(self, command, *args)
        asked.append(command)
        if len(asked) <= tries:
            at = line.index(str(self.bwrap)) + 1
            line[at:at] = ["--no-such-option"]
        return line

    monkeypatch.setattr(CommandRunner, "argv", argv)
    return asked


def test_the_probe_passes_where_sandboxes_come_up() -> None:
    assert CommandRunner().probe() == ""


def test_the_probe_reports_bwraps_own_error_once_it_failed_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked = rejected_option(monkeypatch)
    why = CommandRunner().probe()
    assert asked == ["true"] * PROBE_TRIES  # the steps' own sandbox (argv), for `true`
    assert why.startswith("no workspace sandbox comes up on this host: bwrap: Unknown option")
    assert "--no-such-option" in why and "\n" not in why  # bwrap's text, on one line
    assert "user namespaces" in why  # what to look at


def test_a_probe_that_fails_once_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = rejected_option(monkeypatch, tries=1)
    assert CommandRunner().probe() == "" and len(asked) == 2


def test_a_probe_without_an_answer_condemns_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A sandbox that does not come up in time (a loaded host) is killed, tried once more,
    and the host is not judged: a slow worker must not refuse sessions for ever."""
    hang = ["/bin/sh", "-c", "exec sleep 30.25"]
    monkeypatch.setattr(CommandRunner, "argv", lambda self, *args: hang)
    with caplog.at_level(logging.WARNING, logger="infra.sandbox.workspace"):
        assert CommandRunner().probe(timeout_s=0.3) == ""
    assert "no answer in 0.3s (2 of 2 tries); serving sessions" in caplog.text
    left = [p for p in psutil.process_iter(["cmdline"]) if "30.25" in (p.info["cmdline"] or [])]
    assert not left  # each try's sandbox was killed


def test_a_process_without_capabilities_gets_no_sandbox() -> None:
    """A real host fault, no fake: a root worker whose capabilities are dropped (a container
    without them) cannot drop to the sandbox uid, and the probe says so in the tool's words."""
    probe = "from infra.sandbox.workspace import CommandRunner; print(CommandRunner().probe())"
    dropped = ["setpriv", "--bounding-set=-all", "--inh-caps=-all", sys.executable, "-c", probe]
    why = subprocess.run(dropped, capture_output=True, text=True, check=True, timeout=60).stdout
    assert why.startswith("no workspace sandbox comes up on this host: setpriv:"), why
    assert "Operation not permitted" in why
