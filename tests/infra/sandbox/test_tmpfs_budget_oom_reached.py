"""A workspace command's memory event "reached" (`Cgroups.memory_event` where the kernel counts
no OOM kills, before Linux 4.13: the group's peak came to its limit) is the memory limit's when
the command was SIGKILLed, as "limit" is (`workspace_result.command_result`'s rule). The
command runner read only "limit": there, a command OOM-killed at its limit was `failed`, exit
status 137. Real bwrap runs in real cgroups; the older kernel is stood for by the real memory
group's files copied without their `oom_kill` count, read by the real `memory_event`."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox.cgroups import Cgroups
from infra.sandbox.workspace import CommandRunner, Mounts, cgroup_name, session_uid
from infra.sandbox.workspace_result import CommandResult
from tests.infra.sandbox.slot_workspace import empty_workspace

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0 or not Cgroups.available(),
    reason="needs bwrap, root and cgroups v1",
)
SLOT = 463
PREFIX = "tempered-tmpfs-budget-"
LIMITS = SandboxLimits(timeout_s=20, memory_mb=64, file_size_mb=1024)
MEMORY_FILES = ("limit_in_bytes", "max_usage_in_bytes", "failcnt", "memsw.failcnt")


@pytest.fixture
def workspace() -> Iterator[Path]:
    with empty_workspace(SLOT, PREFIX) as ws:
        yield ws


@pytest.fixture
def uncounted(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple[str, str]]:
    """`memory_event` as a kernel without an `oom_kill` count reads the run's memory group:
    each call's (this kernel's event, the older kernel's) is recorded."""
    real: Callable[[Cgroups], str] = Cgroups.memory_event
    seen: list[tuple[str, str]] = []

    def older_kernel(self: Cgroups) -> str:
        group, copy = self.paths["memory"], tmp_path / f"memory-{len(seen)}"
        copy.mkdir()
        control = (group / "memory.oom_control").read_text().splitlines()
        kept = [line for line in control if not line.startswith("oom_kill ")]
        (copy / "memory.oom_control").write_text("\n".join(kept) + "\n")
        for name in MEMORY_FILES:
            if (group / f"memory.{name}").is_file():
                (copy / f"memory.{name}").write_text((group / f"memory.{name}").read_text())
        seen.append((real(self), real(Cgroups({"memory": copy}))))
        return seen[-1][1]

    monkeypatch.setattr(Cgroups, "memory_event", older_kernel)
    return seen


def run(workspace: Path, command: str) -> CommandResult:
    runner = CommandRunner()
    assert runner.use_cgroups
    mounts = Mounts(workspace)
    return asyncio.run(runner.run(command, mounts, session_uid(SLOT), LIMITS, cgroup_name(SLOT)))


def test_an_oom_kill_at_the_limit_is_memory_exceeded_where_kills_are_not_counted(
    workspace: Path, uncounted: list[tuple[str, str]]
) -> None:
    result = run(workspace, "python3 -c 'x = bytearray(300 << 20)'")
    assert uncounted == [("limit", "reached")]  # the OOM killer's kill, at the limit
    assert result.status is ExecStatus.MEMORY_EXCEEDED, result
    assert result.detail == "memory limit of 64 MB"


def test_a_limit_reached_without_a_sigkill_is_the_commands_own_end(
    workspace: Path, uncounted: list[tuple[str, str]]
) -> None:
    """Page cache fills the group to its limit (reclaimed, no OOM kill): the command's own exit
    status stands, and no note tells of a kill that never was."""
    result = run(workspace, "head -c 160M /dev/zero > big; rm big; exit 3")
    assert uncounted == [("", "reached")]
    assert result.status is ExecStatus.FAILED and result.exit_code == 3, result
    assert result.note == "", result
