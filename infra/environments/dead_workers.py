"""The sessions root of a host, and what dead sandbox workers left in it: their directories,
processes and cgroups.

    claim_root(root)            # SandboxInfraError unless the root is Tempered's (see below)
    swept = sweep_dead(root)    # Sweep(directories=1, processes=2, cgroups=2)

Each worker process owns one directory under the sessions root, `<pid>-<start>`
(`worker_dir_name`): its pid and the kernel's start time of that pid, so a pid reused by a later
process never looks alive. A directory whose worker is gone is removed (with the tmpfs mounted
in it); where no process holds its pid any more, the processes still running under its uids
(bwrap's `--die-with-parent` normally took them already) are killed and its cgroups removed.
`SessionHost` sweeps when its worker starts, and again every `SWEEP_S` (`sessions.py`).

The root is `sandbox.workspaces.root`, which a user may point at a directory of their own:
`claim_root` makes it 0711 (sandbox uids pass through it) only where Tempered made it, as its
`MARKER` file says, and refuses a root that holds anything but workers' directories, or one
shared by its sticky bit (/tmp), naming the setting. A root without the marker that holds
workers' directories alone (one of the build before the marker, an empty one: a mkdtemp, a
pod's emptyDir) is adopted: marked, then used. Before, any directory was made 0711 (/tmp lost
its sticky bit) and its subdirectories whose names begin with digits (`2023/`: pid 2023, no
start time, so "dead") were removed. `sweep_dead` removes only names `WORKER_DIR` matches.

Not covered: the uids and cgroups of a worker whose pid a later process took (they are that
process's, should it be a worker too); its directory is removed all the same.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
from dataclasses import dataclass
from pathlib import Path

import psutil

from infra.environments.mounts import remove_tree
from infra.processes import start_ticks
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.cgroups import sweep_dead_workers
from infra.sandbox.workspace import SLOTS, session_uid

MARKER = ".tempered-workspaces"
"""The file that marks a sessions root as Tempered's (`claim_root`)."""
WORKER_DIR = re.compile(r"([0-9]+)-([0-9]+)")
"""The name of a worker's directory (`worker_dir_name`), matched whole."""
SETTING = "sandbox.workspaces.root"


def worker_dir_name(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{start_ticks(pid)}"


def claim_root(root: Path) -> None:
    """Make `root` (created if missing) a sessions root, 0711, marked as Tempered's; an existing
    one must be marked already, or hold workers' directories alone and not be shared (sticky)."""
    marker = root / MARKER
    try:
        root.mkdir(parents=True)
    except FileExistsError:
        if not marker.exists():
            _adoptable(root)
    if not marker.exists():
        marker.write_text(
            "A sessions root of Tempered's sandbox workers: each removes what dead ones left "
            "here.\n"
        )
    root.chmod(0o711)  # sandbox uids pass through to their own 0700 workspace


def _adoptable(root: Path) -> None:
    """SandboxInfraError unless the unmarked, existing `root` may become a sessions root."""
    foreign = sorted(p.name for p in root.iterdir() if not _worker_dir(p) and p.name != MARKER)
    if foreign:
        shown = ", ".join(repr(name) for name in foreign[:3])
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise SandboxInfraError(
            f"{SETTING} {root} holds what Tempered did not make ({shown}{more}); set {SETTING} "
            "to a new or empty directory (sandbox workers make it 0711 and remove what dead "
            "workers left in it)"
        )
    if root.stat().st_mode & stat.S_ISVTX:
        raise SandboxInfraError(
            f"{SETTING} {root} is shared (its sticky bit is set, as /tmp's is); set {SETTING} "
            "to a directory of Tempered's own, e.g. a new one below it"
        )


def _worker_dir(path: Path) -> bool:
    return WORKER_DIR.fullmatch(path.name) is not None and path.is_dir()


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
        name = WORKER_DIR.fullmatch(directory.name)
        if name is None or not directory.is_dir():
            continue
        pid = int(name[1])
        if name[2] == str(start_ticks(pid)):
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
