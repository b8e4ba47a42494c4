"""A sandbox worker's session host cleans up after itself and after dead workers: the TTL
sweeper closes idle sessions, and `sweep_dead` removes what a dead worker left (its
directory, the processes still running under its workspace uids) and nothing of a live one.

The same guarantees under real SIGKILLs of whole workers are tests/test_sessions_crash.py's
(slow); these run in `make test`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time

import pytest

from contracts.common import ObjectRef
from contracts.task import WorkspaceSpec
from infra.environments.sessions import SessionHost, sweep_dead, worker_dir_name
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


def _sleeper(pid: int) -> subprocess.Popen[bytes]:
    """A process under a workspace uid of worker `pid` (slot 3)."""
    uid = SESSION_UID_BASE + pid * SLOTS + 3
    return subprocess.Popen(["sleep", "60"], user=uid, group=uid)


@needs_root
def test_a_dead_workers_leftovers_are_swept_and_a_live_ones_are_not() -> None:
    root = session_root()
    try:
        dead = _dead_pid()
        (root / f"{dead}-12345" / "s1" / "ws").mkdir(parents=True)  # a dead worker's session
        live = root / worker_dir_name()  # this process: alive, the right start time
        live.mkdir()
        reused = root / f"{os.getpid()}-1"  # this pid, but another start: a dead worker's
        reused.mkdir()
        (root / "notes").mkdir()  # not a worker's: left alone
        (root / "7-1").write_text("")  # a file, not a worker's directory
        orphan = _sleeper(dead)  # a step of the dead worker, still running
        mine = _sleeper(os.getpid())  # a step of the live worker that reuses a dead one's pid
        try:
            swept = sweep_dead(root)
            assert orphan.wait(timeout=10) == -9
            assert mine.poll() is None
        finally:
            orphan.kill()
            mine.kill()
        assert (swept.directories, swept.processes) == (2, 1)
        assert sorted(p.name for p in root.iterdir()) == sorted([live.name, "notes", "7-1"])
        assert sweep_dead(root).directories == 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


@needs_root
@pytest.mark.asyncio
async def test_a_session_idle_past_its_ttl_is_closed_by_the_sweeper() -> None:
    ttl = 10.0  # the sweeper looks every ttl / 4
    host = SessionHost(WorkspaceSettings(root=session_root(), ttl_s=ttl))
    try:
        idle, busy = host.create("s-idle", SPEC), host.create("s-busy", SPEC)
        idle.last_used = time.monotonic() - ttl - 1
        deadline = time.monotonic() + ttl / 4 + 5
        while "s-idle" in host.sessions and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert list(host.sessions) == ["s-busy"]
        assert not idle.directory.exists() and busy.directory.exists()
        assert host.take_slot() == idle.slot  # free again, and the next one taken
    finally:
        await host.shutdown()
        shutil.rmtree(host.root, ignore_errors=True)
