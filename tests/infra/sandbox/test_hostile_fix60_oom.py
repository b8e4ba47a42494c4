"""A workspace command's memory-cgroup OOM does not pick bwrap's outer process (workspace.py's
argv, `OOM_SPARED`): bwrap runs at oom_score_adj -1000 where the worker may lower it, and the
sandbox's pid 1 and the command at 1000 (the first victims), below which they cannot lower it
past the worker's own. Before, a command that filled /dev/shm (tmpfs: counted in no process's
rss) got bwrap killed first, and the sandbox's pid 1, orphaned to the host's init, stayed a
zombie under the slot's uid after the run had returned."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox.workspace import CommandRunner, Mounts, cgroup_name, session_uid
from tests.infra.sandbox.slot_workspace import empty_workspace

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bwrap and root"
)
SLOT = 461
PREFIX = "tempered-fix60-oom-"


@pytest.fixture
def workspace() -> Iterator[Path]:
    with empty_workspace(SLOT, PREFIX) as ws:
        yield ws


def run(workspace: Path, command: str, limits: SandboxLimits):  # type: ignore[no-untyped-def]
    runner = CommandRunner()
    return asyncio.run(
        runner.run(command, Mounts(workspace), session_uid(SLOT), limits, cgroup_name(SLOT))
    )


def processes_of(uid: int) -> list[str]:
    left = []
    for proc in psutil.process_iter(["pid", "ppid", "uids", "status", "name"]):
        with contextlib.suppress(psutil.Error):
            if proc.info["uids"] and proc.info["uids"].real == uid:
                left.append(f"{proc.info['pid']} ppid {proc.info['ppid']} {proc.info['status']}")
    return left


def test_an_oom_on_tmpfs_leaves_no_process_of_the_slot(workspace: Path) -> None:
    limits = SandboxLimits(timeout_s=10, memory_mb=64, tmpfs_mb=256, file_size_mb=1024)
    for _ in range(2):  # bwrap was picked every time before
        result = run(workspace, "head -c 200M /dev/zero > /dev/shm/x", limits)
        assert result.status == ExecStatus.MEMORY_EXCEEDED, result
        assert processes_of(session_uid(SLOT)) == []


def test_the_command_is_the_first_victim_and_cannot_lower_itself_past_the_worker(
    workspace: Path,
) -> None:
    own = int(Path("/proc/self/oom_score_adj").read_text())
    assert own > -1000, "this test needs a worker the OOM killer may pick"
    command = (
        "cat /proc/self/oom_score_adj; cat /proc/1/oom_score_adj; "
        f"echo {own} > /proc/self/oom_score_adj && echo back; "
        "echo -1000 > /proc/self/oom_score_adj || echo refused"
    )
    result = run(workspace, command, SandboxLimits(timeout_s=10))
    assert result.stdout.splitlines() == ["1000", "1000", "back", "refused"], result
