"""Sandboxes that fail at the one seam a workspace command's sandbox is built at
(`CommandRunner.argv`), for the runner's probe tests and the sandbox worker's start-up tests.

    asked = alter_argv(monkeypatch, reject_option, tries=1)   # bwrap refuses the next sandbox
    asked = alter_argv(monkeypatch, fail_with("echo 'bwrap: …' >&2; exit 1"))
    asked = alter_argv(monkeypatch, nproc_one)                # a real EAGAIN, no fake

`asked` collects the command of every sandbox built from then on; the first `tries` (every one
when None) go through the change, the rest are real.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from infra.sandbox.workspace import CommandRunner

Change = Callable[[CommandRunner, list[str], tuple[Any, ...]], list[str]]
"""(runner, the argv it built, the rest of `argv`'s arguments: mounts, uid, limits, cgroups,
status fd) → the argv to run."""


def alter_argv(
    monkeypatch: pytest.MonkeyPatch, change: Change | None = None, tries: int | None = None
) -> list[str]:
    """From now on, the commands of the sandboxes `CommandRunner.argv` builds; the first
    `tries` of them (all when None) changed by `change`."""
    asked: list[str] = []
    build = CommandRunner.argv

    def argv(self: CommandRunner, command: str, *args: Any) -> list[str]:
        line = build(self, command, *args)
        asked.append(command)
        if change is not None and (tries is None or len(asked) <= tries):
            line = change(self, line, args)
        return line

    monkeypatch.setattr(CommandRunner, "argv", argv)
    return asked


def reject_option(runner: CommandRunner, line: list[str], args: tuple[Any, ...]) -> list[str]:
    """bwrap itself refuses the sandbox (an option it does not know), as a bwrap that may not
    create its namespaces refuses every one."""
    at = line.index(str(runner.bwrap)) + 1
    return [*line[:at], "--no-such-option", *line[at:]]


def fail_with(script: str) -> Change:
    """The sandbox is a shell `script` that fails as bwrap would."""
    return lambda runner, line, args: ["/bin/sh", "-c", script]


def nproc_one(runner: CommandRunner, line: list[str], args: tuple[Any, ...]) -> list[str]:
    """RLIMIT_NPROC at 1 for the sandbox uid: bwrap cannot clone its namespaces (EAGAIN), as
    when a pids limit or the kernel's tables are used up for a moment."""
    return [
        *line[:2],
        re.sub(r"ulimit -\$processes \d+", "ulimit -$processes 1", line[2]),
        *line[3:],
    ]
