"""Commands over a workspace (infra/sandbox/workspace.py), on real bwrap and cgroups: the
workspace is read-write at its workdir and nothing else of the host is, every limit holds,
there is no network, and nothing is left behind (processes, cgroups)."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox.cgroups import CGROUP_ROOT, Cgroups
from infra.sandbox.workspace import (
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
