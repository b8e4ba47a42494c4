"""A disk quota for each workspace: a tmpfs of its own, and removing trees that hold mounts.

    mount_tmpfs(ws, size_bytes=256 << 20, inodes=100_000, uid=uid)   # needs CAP_SYS_ADMIN
    remove_tree(session_directory)      # unmounts what is mounted in it, then removes it

A workspace is a host directory that every step's sandbox binds read-write, so without a quota
one `bash` command could fill the host's disk within its wall time (the size is checked only
after it). On a tmpfs of the workspace's size a write past it fails inside the sandbox with
ENOSPC, as on a full disk, and creating files past `inodes` does too. Its pages are memory,
and only what the workspace holds: the size is a bound, not a reservation.

The mounts are in the worker's mount namespace (the host's), so a worker killed with its
sessions open leaves them mounted: `remove_tree` (the dead-worker sweep's, the session close's)
unmounts every mount in a tree before removing it, deepest first, lazily (a sandbox still
holding one lets go when it dies).

Not covered: a quota where the worker may not mount (no CAP_SYS_ADMIN, e.g. a non-root pod):
workspaces are then plain directories (`WorkspaceSettings.disk`).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import subprocess
from pathlib import Path

SOURCE = "tempered-workspace"
"""The source name of every workspace tmpfs (what `mount` and /proc/mounts show)."""
_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, path: Path) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), os.fspath(path))


def mount_tmpfs(path: Path, size_bytes: int, inodes: int, uid: int, mode: int = 0o700) -> None:
    """Mount a tmpfs of `size_bytes` and `inodes` on the directory `path`, its root owned by
    `uid` with `mode` (no set-uid programs, no device files). `huge=never`: the scan in
    infra/environments/disk.py charges whole small pages, which a huge-page tmpfs would not hold."""
    options = f"size={size_bytes},nr_inodes={inodes},mode={mode:o},uid={uid},gid={uid},huge=never"
    result = _libc.mount(
        SOURCE.encode(), os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, options.encode()
    )
    _check(result, path)


def unmount(path: Path) -> None:
    """Detach the mount on `path` (nothing mounted there, or no `path`: nothing to do)."""
    try:
        _check(_libc.umount2(os.fsencode(path), _MNT_DETACH), path)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOENT):
            raise


def mounts_under(root: Path) -> list[Path]:
    """The mount points at and below `root`, deepest first (from /proc/self/mountinfo)."""
    top = os.path.realpath(root).rstrip("/")
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as table:
        for line in table:
            point = _unescape(line.split(" ", 5)[4])
            if point == top or point.startswith(top + "/"):
                found.append(Path(point))
    return sorted(found, key=lambda path: len(path.parts), reverse=True)


def _unescape(field: str) -> str:
    r"""mountinfo writes a space, tab, newline or backslash in a path as \040, \011, \012, \134."""
    return re.sub(r"\\([0-7]{3})", lambda code: chr(int(code[1], 8)), field)


def remove_tree(path: Path) -> None:
    """Unmount what is mounted at and below `path`, then remove it (what is missing is
    skipped)."""
    for point in mounts_under(path):
        unmount(point)
    remove(path)


def remove(path: Path) -> None:
    """Remove the tree at `path`, whatever its agent left in it: `rmtree` recurses once a
    level (a tree nested deeper than Python's recursion limit broke it) and cannot empty a
    directory made unwritable on a worker that is not root; then `chmod -R` and `rm -rf`
    (iterative, as coreutils walk) finish it. OSError if even they cannot."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except (OSError, RecursionError):
        subprocess.run(["chmod", "-R", "u+rwx", "--", str(path)], capture_output=True)
        done = subprocess.run(
            ["rm", "-rf", "--one-file-system", "--", str(path)], capture_output=True
        )
        if done.returncode != 0:
            raise OSError(
                f"rm -rf {path}: {done.stderr.decode(errors='replace').strip()}"
            ) from None
