"""What dead sandbox workers left on a host: their directories, processes and cgroups.

    swept = sweep_dead(root)    # Sweep(directories=1, processes=2, cgroups=2)

Each worker process owns one directory under the sessions root, `<pid>-<start>`
(`worker_dir_name`): its pid and the kernel's start time of that pid, so a pid reused by a later
process never looks alive. A directory whose worker is gone is removed (with the tmpfs mounted
in it); where no process holds its pid any more, the processes still running under its uids
(bwrap's `--die-with-parent` normally took them already) are killed and its cgroups removed.
`SessionHost` sweeps when its worker starts, and again every `SWEEP_S` (`sessions.py`).

Not covered: the uids and cgroups of a worker whose pid a later process took (they are that
process's, should it be a worker too); its directory is removed all the same.
"""

from __future__ import annotations

import contextlib
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import psutil

from infra.environments.mounts import remove_tree
from infra.processes import start_ticks
from infra.sandbox.cgroups import sweep_dead_workers
from infra.sandbox.workspace import SLOTS, session_uid


def worker_dir_name(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{start_ticks(pid)}"


@dataclass
class Sweep:
    """What a start-up sweep removed."""

    directories: int = 0
    processes: int = 0
    cgroups: int = 0


def sweep_dead(root: Path) -> Sweep:
    """Remove what dead workers left under `root`: directories, processes, cgroups."""
    swept = Sweep()
    for directory in root.iterdir():
        pid_text, _, ticks = directory.name.partition("-")
        if not pid_text.isdigit() or not directory.is_dir():
            continue
        pid = int(pid_text)
        if ticks == str(start_ticks(pid)):
            continue  # its worker is alive
        if start_ticks(pid) is None:  # no process has its pid: its uids and cgroups are free
            swept.processes += _kill_uids(pid)
            swept.cgroups += sweep_dead_workers(pid)
        remove_tree(directory)
        swept.directories += 1
    return swept


def _kill_uids(pid: int) -> int:
    """SIGKILL every process running under a workspace uid of worker `pid`."""
    uids = {session_uid(slot, pid) for slot in range(SLOTS)}
    killed = 0
    for process in psutil.process_iter(["uids"]):
        with contextlib.suppress(psutil.Error, TypeError):
            if process.info["uids"].real in uids:
                os.kill(process.pid, signal.SIGKILL)
                killed += 1
    return killed
