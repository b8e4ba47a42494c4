"""What a workspace command's sandbox did, read from what bwrap and the host saw of it.

    messages = status_messages(reported)     # bwrap's --json-status-fd lines, merged
    result = command_result(messages, timed_out, oom, limits, duration_ms, stdout, stderr, code,
                            cpu_used=cgroups.cpu_used())

bwrap reports on its status fd once the sandbox is up ("child-pid") and again with the
command's exit code ("exit-code"), so a sandbox that never came up, or whose bwrap failed to
set it up (a mount, a uid), is a platform fault (`SandboxNotUp`, a `SandboxInfraError`), never
a result. One set-up failure is the command's own: bwrap could not enter the workdir, the
workspace's root, for its mode (the agent's `chmod 000 .`: every other directory on the way is
bwrap's own), a failed result with no exit code (`ROOT_REFUSED`).

Otherwise the command's status, in this order: its deadline (wall time, or its own time:
`workspace_deadline.py`; the host killed the sandbox), its memory limit (the cgroup's event, where
the command was killed: SIGKILL, as its shell reports it, or no exit code), its CPU limit
(`cpu_killed`), its exit code. The exit status its shell reports for a signal is 128 + its
number, which a command may also exit with, so a status alone proves no kill. A process that hit
the memory limit while the command went on to end by itself leaves a `note`, not a kill: a test
run that survived one child's OOM exits 0 or 1 as it decided. Pure functions of what
`CommandRunner.run` collected (`workspace.py`); not covered: collecting it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from dataclasses import dataclass

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.process import Capture


@dataclass(frozen=True)
class CommandResult:
    """What one command did."""

    status: ExecStatus
    exit_code: int | None
    stdout: str
    stderr: str
    truncated: bool
    duration_ms: int
    detail: str = ""
    note: str = ""
    """What else the run met, where it did not end the command ("a process hit the memory
    limit of 64 MB")."""


ROOT_REFUSED = re.compile(r"^bwrap: Can't chdir to (/[^\n]*): Permission denied$", re.MULTILINE)
"""bwrap's words where it may not enter the workdir (`--chdir`, its only one): the workspace
bound there, whose mode (its owner's search bit) is the only one on the way that is not bwrap's."""


class SandboxNotUp(SandboxInfraError):
    """A sandbox that never came up, or whose bwrap failed to set it up: also what its
    launcher wrote to stderr, how the launcher ended (its return code: negative, a signal)
    and whether the deadline passed first, for the start-up probe (`probe.py`). Caused by
    the OSError where the launcher could not be started at all."""

    def __init__(
        self, message: str, stderr: str = "", returncode: int | None = None, timed_out: bool = False
    ) -> None:
        super().__init__(message)
        self.stderr, self.returncode, self.timed_out = stderr, returncode, timed_out


def status_messages(data: bytes) -> dict[str, object]:
    """bwrap's JSON status messages (one object per line), merged."""
    merged: dict[str, object] = {}
    for line in data.decode("utf-8", "replace").splitlines():
        with contextlib.suppress(ValueError):
            message = json.loads(line)
            if isinstance(message, dict):
                merged.update(message)
    return merged


def command_result(
    messages: dict[str, object], timed_out: bool, oom: bool, limits: SandboxLimits,
    duration_ms: int, stdout: Capture, stderr: Capture, returncode: int | None,
    gave_away: str = "", cpu_used: float | None = None, reached: bool = False,
) -> CommandResult:  # fmt: skip
    """The command's result, or `SandboxNotUp`. `gave_away`: how a command whose deadline
    counted its own time gave that time away, so that the wall clock counted (its timeout's
    detail says so). `cpu_used`: the CPU seconds of the run's cgroup (None: none is known).
    `oom`: an OOM kill at the limit; `reached`: the limit reached where the kernel counts no
    OOM kills, memory only for a SIGKILL the CPU limit does not explain (the judge's order)."""

    def not_up(message: str) -> SandboxNotUp:
        return SandboxNotUp(message, stderr.text(), returncode, timed_out)

    if "child-pid" not in messages:
        if timed_out:
            raise not_up(f"the workspace sandbox did not start in {limits.timeout_s}s")
        raise not_up(f"the workspace sandbox failed to start: {stderr.text()[-2000:]}")
    code = messages.get("exit-code")
    exit_code = code if isinstance(code, int) else None
    if exit_code is None and not (oom or reached or timed_out):  # bwrap failed (a mount, a uid)
        if refused := ROOT_REFUSED.search(stderr.text()):  # the agent's own doing
            detail = (
                f"the sandbox could not enter {refused[1]}, the workspace's root directory "
                "(Permission denied: its mode lets its owner no search, e.g. after `chmod 000 .`)"
            )
            return _result(ExecStatus.FAILED, None, stdout, stderr, duration_ms, detail)
        raise not_up(f"the workspace sandbox failed to set up: {stderr.text()[-2000:]}")
    note = ""
    if timed_out:
        status, detail = ExecStatus.TIMEOUT, f"wall-clock deadline of {limits.timeout_s}s"
        if gave_away:
            detail += f" (the wall clock counted in full: {gave_away})"
    elif oom and exit_code in (None, 128 + signal.SIGKILL):  # the OOM killer's signal
        status, detail = ExecStatus.MEMORY_EXCEEDED, f"memory limit of {limits.memory_mb} MB"
    elif cpu_killed(exit_code, limits, cpu_used, duration_ms):
        status, detail = ExecStatus.TIMEOUT, f"CPU limit of {limits.cpu_s}s"
    elif reached and exit_code in (None, 128 + signal.SIGKILL):
        status, detail = ExecStatus.MEMORY_EXCEEDED, f"memory limit of {limits.memory_mb} MB"
    elif exit_code == 0:
        status, detail = ExecStatus.PASSED, ""
    else:
        status, detail = ExecStatus.FAILED, f"exit status {exit_code}"
    if oom and status is not ExecStatus.MEMORY_EXCEEDED:
        note = f"a process hit the memory limit of {limits.memory_mb} MB"
    return _result(status, exit_code, stdout, stderr, duration_ms, detail, note)


CPU_COUNTED_SHARE = 0.75
"""The share of `cpu_s` a run's cgroup must have counted for an exit by SIGXCPU or SIGKILL to be
the CPU limit's: the kernel sends SIGXCPU at the process's tick-sampled CPU time, which ran ahead
of the group's exact count on a loaded host (a hog's group read under `cpu_s` at its SIGXCPU)."""


def cpu_killed(
    exit_code: int | None, limits: SandboxLimits, cpu_used: float | None, duration_ms: int
) -> bool:
    """Whether the CPU limit ended the command: its shell reports a kill by SIGXCPU (at
    `cpu_s`) or SIGKILL (a second later), and the run used that much CPU time: its cgroup's
    count (`cpu_used`), or without one the most `duration_ms` held on this host's CPUs (an
    `exit 152` of the command's own, at once, held too little)."""
    if exit_code not in (128 + signal.SIGXCPU, 128 + signal.SIGKILL):
        return False
    if cpu_used is None:  # the most it could have held: no margin for what was never counted
        return duration_ms / 1000 * (os.cpu_count() or 1) >= limits.cpu_s
    return cpu_used >= limits.cpu_s * CPU_COUNTED_SHARE


def _result(
    status: ExecStatus, exit_code: int | None, stdout: Capture, stderr: Capture,
    duration_ms: int, detail: str, note: str = "",
) -> CommandResult:  # fmt: skip
    return CommandResult(
        status=status,
        exit_code=exit_code,
        stdout=stdout.text(),
        stderr=stderr.text(),
        truncated=stdout.truncated or stderr.truncated,
        duration_ms=duration_ms,
        detail=detail,
        note=note,
    )
