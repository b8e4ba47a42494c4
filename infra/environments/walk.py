"""Walking a workspace the agent wrote: what a snapshot keeps, and what it removes.

A snapshot keeps directories, regular files and links whose paths (and link targets) are UTF-8.
No manifest can hold anything else (a FIFO, a socket, a name or a link target that is not UTF-8),
so a workspace restored from a snapshot would lack it. A session's scan removes such entries
from the live workspace too (`prune`), so an episode sees the same workspace whether or not a
crash had its session restored, and the agent is told what went (`Scanner.unkept`). For the same
reason it clears the setuid and setgid bits no tree keeps (`tree_entry.KEPT_MODE`).

The walk never follows a link: it opens each directory relative to its parent's descriptor with
O_NOFOLLOW (`disk.DIR_FLAGS`). It does not read files; `snapshots.Scanner` does.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator

from infra.environments.disk import DIR_FLAGS, FILE_FLAGS
from infra.environments.paths import is_utf8
from infra.environments.tree import TreeError

SETID = stat.S_ISUID | stat.S_ISGID
MAX_DEPTH = 256
"""Directory levels one workspace may nest (PATH_MAX allows some 2,000 of one letter)."""


def walk(
    dir_fd: int, unkept: list[str], prune: bool, prefix: str = "", depth: int = 1
) -> Iterator[tuple[str, int, str, os.stat_result]]:
    """(path, parent fd, name, lstat) of every directory, link and regular file with a UTF-8
    path under the open directory `dir_fd`, parents first, in name order. What a snapshot
    cannot keep is left out and its printable path appended to `unkept`, and with `prune` it is
    removed (and setuid and setgid bits cleared). TreeError past `MAX_DEPTH` levels."""
    if depth > MAX_DEPTH:  # a frame and a descriptor a level: never the worker's limits
        raise TreeError(f"the workspace nests directories deeper than {MAX_DEPTH} levels")
    with os.scandir(dir_fd) as listing:
        names = sorted(entry.name for entry in listing)
    for name in names:
        path = f"{prefix}{name}"
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        mode = info.st_mode
        if not (is_utf8(path) and (stat.S_ISDIR(mode) or stat.S_ISLNK(mode) or stat.S_ISREG(mode))):
            leave_out(dir_fd, name, path, unkept, prune)
            continue
        if prune and mode & SETID and not stat.S_ISLNK(mode):
            info = _clear_setid(dir_fd, name, path, info)
        yield path, dir_fd, name, info
        if stat.S_ISDIR(mode):
            child = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
            try:
                yield from walk(child, unkept, prune, path + "/", depth + 1)
            finally:
                os.close(child)


def _clear_setid(dir_fd: int, name: str, path: str, info: os.stat_result) -> os.stat_result:
    """Clear the setuid and setgid bits of the file or directory `name` (under the open
    directory `dir_fd`) through a descriptor, never a link; its stat after."""
    flags = DIR_FLAGS if stat.S_ISDIR(info.st_mode) else FILE_FLAGS
    fd = os.open(name, flags, dir_fd=dir_fd)
    try:
        if os.fstat(fd).st_ino != info.st_ino:
            raise TreeError(f"{path!r} changed while it was read")
        os.fchmod(fd, stat.S_IMODE(info.st_mode) & ~SETID)
        return os.fstat(fd)
    finally:
        os.close(fd)


def leave_out(dir_fd: int, name: str, path: str, unkept: list[str], prune: bool) -> None:
    """Record `path` (under the open directory `dir_fd`) as not kept; with `prune`, remove it
    (a directory with all it holds, its links not followed)."""
    unkept.append(os.fsencode(path).decode("utf-8", "backslashreplace"))
    if not prune:
        return
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISDIR(info.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)
