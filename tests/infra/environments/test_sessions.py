"""A sandbox worker's session host cleans up after itself and after dead workers: the TTL
sweeper closes idle sessions, and `sweep_dead` removes what a dead worker left (its
directory and the tmpfs mounted in it, the processes still running under its workspace uids)
and nothing of a live one.

The same guarantees under real SIGKILLs of whole workers are tests/test_sessions_crash.py's
(slow); these run in `make test`.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time

import pytest

from contracts.common import ObjectRef
from contracts.task import WorkspaceSpec
from infra.environments.dead_workers import sweep_dead, worker_dir_name
from infra.environments.mounts import mount_tmpfs, mounts_under, remove_tree
from infra.environments.sessions import SessionHost
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.workspace import SESSION_UID_BASE, SLOTS
from infra.settings import WorkspaceSettings
from tests.infra.environments.conftest import session_root

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (workspace uids)")
NOWHERE = ObjectRef(key="unused", size=0, sha256="0" * 64)
SPEC = WorkspaceSpec(files=NOWHERE, verifier=NOWHERE)


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped (free for a while)."""
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


def _sleeper(pid: int, slot: int = 3) -> subprocess.Popen[bytes]:
    """A process under a workspace uid of worker `pid`."""
    uid = SESSION_UID_BASE + pid * SLOTS + slot
    return subprocess.Popen(["sleep", "60"], user=uid, group=uid)


@needs_root
def test_a_dead_workers_leftovers_are_swept_and_a_live_ones_are_not() -> None:
    root = session_root()
    try:
        dead = _dead_pid()
        workspace = root / f"{dead}-12345" / "s1" / "ws"  # a dead worker's session
        workspace.mkdir(parents=True)
        mount_tmpfs(workspace, 1 << 20, 16, 0)  # its quota, still mounted
        (workspace / "file").write_text("left")
        live = root / worker_dir_name()  # this process: alive, the right start time
        assert live.name.startswith(f"{os.getpid()}-")
        live.mkdir()
        reused = root / f"{os.getpid()}-1"  # this pid, but another start: a dead worker's
        reused.mkdir()
        (root / "notes").mkdir()  # not a worker's: left alone
        (root / "7-1").write_text("")  # a file, not a worker's directory
        # steps of the dead worker, still running (its first and last uid)
        orphans = [_sleeper(dead, 0), _sleeper(dead, SLOTS - 1)]
        mine = _sleeper(os.getpid())  # a step of the live worker that reuses a dead one's pid
        neighbour = _sleeper(dead + 1, 0)  # the first uid past the dead worker's
        try:
            swept = sweep_dead(root)
            assert [orphan.wait(timeout=10) for orphan in orphans] == [-9, -9]
            assert mine.poll() is None and neighbour.poll() is None
        finally:
            for process in [*orphans, mine, neighbour]:
                process.kill()
        assert (swept.directories, swept.processes) == (2, 2)
        assert sorted(p.name for p in root.iterdir()) == sorted([live.name, "notes", "7-1"])
        assert mounts_under(root) == []
        assert sweep_dead(root).directories == 0
    finally:
        remove_tree(root)


@needs_root
@pytest.mark.asyncio
async def test_a_session_idle_past_its_ttl_is_closed_by_the_sweeper() -> None:
    ttl = 10.0  # the sweeper looks every ttl / 4
    host = SessionHost(WorkspaceSettings(root=session_root(), ttl_s=ttl))
    try:
        idle, busy = host.create("s-idle", SPEC), host.create("s-busy", SPEC)
        idle.last_used = time.monotonic() - ttl - 1
        deadline = time.monotonic() + ttl / 4 + 5

        def closed() -> bool:  # forgotten first, then removed, then its slot freed
            return idle.slot in host._free

        while not closed() and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert list(host.sessions) == ["s-busy"]
        assert not idle.directory.exists() and busy.directory.exists()
        assert host.take_slot() == idle.slot  # free again, and the next one taken
    finally:
        await host.shutdown()
        remove_tree(host.root)


@needs_root
@pytest.mark.asyncio
async def test_a_workspace_is_its_sessions_alone_and_a_worker_holds_its_slots() -> None:
    host = SessionHost(WorkspaceSettings(root=session_root()))
    try:
        session = host.create("s-1", SPEC)
        ws = (session.directory / "ws").stat()
        assert stat.S_IMODE(ws.st_mode) == 0o700 and ws.st_uid == ws.st_gid == session.uid
        slots = {session.slot} | {host.take_slot() for _ in range(SLOTS - 1)}
        assert slots == set(range(SLOTS))  # each of its uids once, none of another worker's
        with pytest.raises(SandboxInfraError, match=f"more than {SLOTS} sessions"):
            host.take_slot()
        assert await host.close(["s-1", "s-unknown"]) == 1
        assert not session.directory.exists()
        sweeper = host._sweeper
    finally:
        await host.shutdown()
        remove_tree(host.root)
    assert sweeper is not None and sweeper.cancelled()  # the TTL sweeper ends with the host


@needs_root
@pytest.mark.parametrize(
    ("disk", "outcome"),
    [
        ("tmpfs", "SandboxInfraError: sandbox.workspaces.disk is tmpfs, but this worker cannot "
         "mount one (Operation not permitted: it needs CAP_SYS_ADMIN)"),
        ("auto", "tmpfs False"),
    ],
)  # fmt: skip
def test_a_worker_that_cannot_mount_says_so_or_keeps_directories(disk: str, outcome: str) -> None:
    """Root without CAP_SYS_ADMIN (a container's root): an explicit `tmpfs` is one clear error
    at the host's start; `auto` falls back to directories."""
    root = session_root()
    program = (
        "from infra.environments.sessions import SessionHost\n"
        "from infra.settings import WorkspaceSettings\n"
        "try:\n"
        f"    host = SessionHost(WorkspaceSettings(root={str(root)!r}, disk={disk!r}))\n"
        "except Exception as exc:\n"
        "    print(f'{type(exc).__name__}: {exc}')\n"
        "else:\n"
        "    print('tmpfs', host.tmpfs)\n"
    )
    try:
        ran = subprocess.run(
            ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", sys.executable],
            input=program, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
    finally:
        remove_tree(root)
    assert ran.stdout.strip().startswith(outcome), ran.stdout + ran.stderr
