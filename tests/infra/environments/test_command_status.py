"""How a workspace command's end reads to the agent, on real bwrap: "killed" only where the
command did not end by itself (a memory kill of the command, its deadline, its CPU limit);
otherwise its exit code, with a note where one of its processes hit the memory limit. An exit
status of 152 (128 + SIGXCPU) is the command's own unless the run used its CPU time. A sandbox
that cannot enter the workspace because of the root's own mode (the agent's `chmod 000 .`) is
the agent's observation, not a platform fault; a bwrap that fails otherwise still is one."""

from __future__ import annotations

import pytest

from contracts.episode import ToolCall
from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.environments.tools import command_text
from infra.sandbox.process import Capture
from infra.sandbox.workspace import (
    CommandRunner,
    Mounts,
    SandboxNotUp,
    cgroup_name,
    command_result,
)
from tests.infra.environments.conftest import Rig, needs_root

pytestmark = [needs_root, pytest.mark.asyncio]
LIMITS = SandboxLimits(timeout_s=30, memory_mb=64)
FILES = {"README.md": "hi\n"}
HOG = "python3 -c 'x = bytearray(200 << 20)'"
"""A child over the 64 MB limit: the OOM killer ends it."""


def bash(command: str) -> ToolCall:
    return ToolCall(name="bash", arguments={"command": command})


async def test_a_command_that_outlived_a_memory_kill_reports_its_exit_code(rig: Rig) -> None:
    state = await rig.env.reset(rig.spec(FILES), "s0")
    state, seen = await rig.env.step(
        state, bash(f"{HOG} 2>/dev/null || echo carrying on; exit 0"), LIMITS
    )
    assert seen.status is ExecStatus.PASSED, seen
    assert seen.text.splitlines()[:3] == [
        "exit code: 0",
        "(a process hit the memory limit of 64 MB)",
        "stdout:",
    ], seen.text
    assert "killed" not in seen.text
    state, seen = await rig.env.step(state, bash(f"{HOG} 2>/dev/null; exit 3"), LIMITS)
    assert seen.status is ExecStatus.FAILED, seen
    assert seen.text == "exit code: 3\n(a process hit the memory limit of 64 MB)", seen.text
    # the command itself killed at the limit: killed, as before
    state, seen = await rig.env.step(state, bash(HOG), LIMITS)
    assert seen.status is ExecStatus.MEMORY_EXCEEDED, seen
    assert seen.text.startswith("the command was killed: memory limit of 64 MB"), seen.text


async def test_an_exit_status_of_152_is_the_commands_own(rig: Rig) -> None:
    state = await rig.env.reset(rig.spec(FILES), "s0")
    state, seen = await rig.env.step(state, bash("echo tests: 3 failed; exit 152"), LIMITS)
    assert seen.status is ExecStatus.FAILED, seen
    assert seen.text == "exit code: 152\nstdout:\ntests: 3 failed", seen.text
    state, seen = await rig.env.step(state, bash("exit 137"), LIMITS)
    assert (seen.status, seen.text) == (ExecStatus.FAILED, "exit code: 137"), seen
    # a command past its CPU time: killed by its CPU limit, as before
    cpu = LIMITS.model_copy(update={"cpu_s": 1})
    state, seen = await rig.env.step(state, bash("while :; do :; done"), cpu)
    assert seen.status is ExecStatus.TIMEOUT, seen
    assert seen.text.startswith("the command was killed: CPU limit of 1s\n"), seen.text


@pytest.mark.parametrize(
    ("code", "cpu_used", "duration_ms", "status"),
    [
        (152, 0.01, 60_000, ExecStatus.FAILED),  # a minute's sleep, then `exit 152`
        (152, 10.0, 10_100, ExecStatus.TIMEOUT),  # SIGXCPU at the limit
        (137, 11.0, 11_100, ExecStatus.TIMEOUT),  # SIGKILL a second later (SIGXCPU ignored)
        (137, 0.01, 60_000, ExecStatus.FAILED),  # a `kill -9` of its own
        (152, None, 50, ExecStatus.FAILED),  # no cgroup: 50 ms cannot hold 10 s of CPU here
    ],
)
async def test_a_cpu_kill_is_decided_by_the_cpu_the_run_used(
    code: int, cpu_used: float | None, duration_ms: int, status: ExecStatus
) -> None:
    """What the runner collected (its cgroup's CPU seconds) decides: the status a shell reports
    for a SIGXCPU is also one a command can exit with."""
    messages: dict[str, object] = {"child-pid": 2, "exit-code": code}
    limits = SandboxLimits()
    out, err = Capture(1000), Capture(1000)
    result = command_result(
        messages, False, False, limits, duration_ms, out, err, code, cpu_used=cpu_used
    )
    assert (result.status, result.exit_code) == (status, code), result


async def test_a_workspace_root_the_agent_closed_is_its_observation(rig: Rig) -> None:
    """bwrap cannot chdir into a root of mode 000: the step tells the agent so (a step like any
    other), where it was a platform fault retried for ever."""
    state = await rig.env.reset(rig.spec(FILES), "s0")
    workspace = rig.host.sessions["s0"].workspace
    mode = workspace.stat().st_mode & 0o7777
    workspace.chmod(0)  # what `chmod 000 .` in the step before left
    try:
        state, seen = await rig.env.step(state, bash("ls"), LIMITS)
    finally:
        workspace.chmod(mode)
    assert seen.status is ExecStatus.FAILED, seen
    assert seen.text.startswith(
        "the command did not start: the sandbox could not enter /app, the workspace's root "
        "directory (Permission denied: its mode"
    ), seen.text


async def test_the_same_refusal_through_the_runner(rig: Rig) -> None:
    """The runner's result, and its text: no exit code (nothing ran)."""
    await rig.env.reset(rig.spec(FILES), "s0")
    session = rig.host.sessions["s0"]
    mode = session.workspace.stat().st_mode & 0o7777
    session.workspace.chmod(0o600)  # no search (x) for its owner
    try:
        result = await CommandRunner().run(
            "ls", Mounts(session.workspace, "/srv/app"), session.uid, LIMITS,
            cgroup_name(session.slot),
        )  # fmt: skip
    finally:
        session.workspace.chmod(mode)
    assert (result.status, result.exit_code) == (ExecStatus.FAILED, None), result
    assert "could not enter /srv/app" in command_text(result, LIMITS.output_bytes)


async def test_a_bwrap_that_fails_otherwise_is_still_a_platform_fault(rig: Rig) -> None:
    await rig.env.reset(rig.spec(FILES), "s0")
    session = rig.host.sessions["s0"]
    missing = session.workspace.parent / "no-such-tree"
    mounts = Mounts(session.workspace, extra=((missing, "/data", False),))
    with pytest.raises(SandboxNotUp, match="failed to set up: bwrap: Can't find source"):
        await CommandRunner().run("true", mounts, session.uid, LIMITS, cgroup_name(session.slot))
    # nor is a chdir that failed for another reason than the root's mode (no such directory)
    with pytest.raises(SandboxNotUp):
        command_result(
            {"child-pid": 2}, False, False, LIMITS, 10, Capture(100),
            _said("bwrap: Can't chdir to /app: No such file or directory\n"), 1,
        )  # fmt: skip


def _said(text: str) -> Capture:
    capture = Capture(1000)
    capture.add(text.encode())
    return capture


@pytest.mark.parametrize(
    ("code", "cpu_used", "status", "note"),
    [
        (137, 12.0, ExecStatus.TIMEOUT, ""),  # the CPU limit's SIGKILL, a page-cache peak before
        (137, 0.5, ExecStatus.MEMORY_EXCEEDED, ""),  # a SIGKILL the CPU does not explain
        (1, 0.5, ExecStatus.FAILED, ""),  # its own exit: no kill, no note of one
    ],
)
async def test_a_limit_reached_without_a_kill_count_is_weighed_after_the_cpu(
    code: int, cpu_used: float, status: ExecStatus, note: str
) -> None:
    """Where the kernel counts no OOM kills, `memory_event` says only that the limit was reached
    (page cache too): it took every SIGKILL for memory, a CPU kill included, before the CPU
    rule, and noted a memory kill on a command's own exit."""
    messages: dict[str, object] = {"child-pid": 2, "exit-code": code}
    out, err = Capture(1000), Capture(1000)
    result = command_result(
        messages, False, False, SandboxLimits(), 12_000, out, err, code, cpu_used=cpu_used,
        reached=True,
    )  # fmt: skip
    assert (result.status, result.note) == (status, note), result
