"""What a workspace command's sandbox did, read from what bwrap and the host saw of it.

    messages = status_messages(reported)     # bwrap's --json-status-fd lines, merged
    result = command_result(messages, timed_out, oom, limits, duration_ms, stdout, stderr, code)

bwrap reports on its status fd once the sandbox is up ("child-pid") and again with the
command's exit code ("exit-code"), so a sandbox that never came up, or whose bwrap failed to
set it up (a mount, a uid), is a platform fault (`SandboxNotUp`, a `SandboxInfraError`), never
a result. Otherwise the command's status, in this order: its memory limit (the cgroup's event),
its deadline (wall time, or its own time: `workspace_deadline.py`), its CPU limit (SIGXCPU, as
its shell reports it), its exit code. Pure functions of what `CommandRunner.run` collected
(`workspace.py`); not covered: collecting it.
"""

from __future__ import annotations

import contextlib
import json
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
    gave_away: str = "",
) -> CommandResult:  # fmt: skip
    """The command's result, or `SandboxNotUp`. `gave_away`: how a command whose deadline
    counted its own time gave that time away, so that the wall clock counted (its timeout's
    detail says so)."""

    def not_up(message: str) -> SandboxNotUp:
        return SandboxNotUp(message, stderr.text(), returncode, timed_out)

    if "child-pid" not in messages:
        if timed_out:
            raise not_up(f"the workspace sandbox did not start in {limits.timeout_s}s")
        raise not_up(f"the workspace sandbox failed to start: {stderr.text()[-2000:]}")
    code = messages.get("exit-code")
    exit_code = code if isinstance(code, int) else None
    if exit_code is None and not (oom or timed_out):  # bwrap itself failed (a mount, a uid)
        raise not_up(f"the workspace sandbox failed to set up: {stderr.text()[-2000:]}")
    if oom:
        status, detail = ExecStatus.MEMORY_EXCEEDED, f"memory limit of {limits.memory_mb} MB"
    elif timed_out:
        status, detail = ExecStatus.TIMEOUT, f"wall-clock deadline of {limits.timeout_s}s"
        if gave_away:
            detail += f" (the wall clock counted in full: {gave_away})"
    elif exit_code == 128 + signal.SIGXCPU:
        status, detail = ExecStatus.TIMEOUT, f"CPU limit of {limits.cpu_s}s"
    elif exit_code == 0:
        status, detail = ExecStatus.PASSED, ""
    else:
        status, detail = ExecStatus.FAILED, f"exit status {exit_code}"
    return CommandResult(
        status=status,
        exit_code=exit_code,
        stdout=stdout.text(),
        stderr=stderr.text(),
        truncated=stdout.truncated or stderr.truncated,
        duration_ms=duration_ms,
        detail=detail,
    )
