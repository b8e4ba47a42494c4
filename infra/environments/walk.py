"""Walking a workspace the agent wrote: what a snapshot keeps, and what it removes.

A snapshot keeps directories, regular files and links whose paths (and link targets) are UTF-8.
No manifest can hold anything else (a FIFO, a socket, a name or a link target that is not UTF-8),
so a workspace restored from a snapshot would lack it. A session's scan removes such entries
from the live workspace too (`prune`), so an episode sees the same workspace whether or not a
crash had its session restored, and the agent is told what went (`Scanner.unkept`). For the same
reason it clears the setuid and setgid bits no tree keeps (`tree_entry.KEPT_MODE`).

The walk never follows a link: it opens each directory relative to its parent's descriptor with
O_NOFOLLOW (`disk.DIR_FLAGS`). It does not read files; `snapshots.Scanner` does. What it
removes it removes level by level from a stack of descriptors, never recursing (`shutil.rmtree`
recurses once a level: a directory nested past Python's limit under a name that is not UTF-8 was
a RecursionError, the step retried without end), and past `MAX_DEPTH` levels it is TreeError,
as the same nesting under a UTF-8 name is.
"""

from __future__ import annotations

import os
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
            leave_out(dir_fd, name, path, unkept, prune, depth)
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


def leave_out(
    dir_fd: int, name: str, path: str, unkept: list[str], prune: bool, depth: int = 1
) -> None:
    """Record `path` (under the open directory `dir_fd`, `depth` levels down) as not kept; with
    `prune`, remove it (a directory with all it holds, its links not followed; TreeError if it
    nests past `MAX_DEPTH` levels, as `walk`, some of it then removed)."""
    unkept.append(os.fsencode(path).decode("utf-8", "backslashreplace"))
    if not prune:
        return
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISDIR(info.st_mode):
        _remove_directory(dir_fd, name, depth + 1)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _remove_directory(dir_fd: int, name: str, depth: int) -> None:
    """Remove the directory `name` under `dir_fd` and all it holds, without recursion: a stack
    of (descriptor, name, subdirectories left) a level, the directory listed at `depth`."""
    stack: list[tuple[int, str, list[str]]] = []
    try:
        parent, child = dir_fd, name
        while True:
            if child:  # go down a level: its files go at once, its directories one by one
                if depth + len(stack) > MAX_DEPTH:
                    raise TreeError(
                        f"the workspace nests directories deeper than {MAX_DEPTH} levels"
                    )
                stack.append((os.open(child, DIR_FLAGS, dir_fd=parent), child, []))
                stack[-1][2].extend(_remove_files(stack[-1][0]))
            fd, own, below = stack[-1]
            if below:
                parent, child = fd, below.pop()
                continue
            stack.pop()
            os.close(fd)
            parent, child = (stack[-1][0] if stack else dir_fd), ""
            os.rmdir(own, dir_fd=parent)
            if not stack:
                return
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _remove_files(dir_fd: int) -> list[str]:
    """Unlink all but the directories in the open directory `dir_fd`; the directories' names."""
    with os.scandir(dir_fd) as listing:
        entries = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in listing]
    for name, directory in entries:
        if not directory:
            os.unlink(name, dir_fd=dir_fd)
    return [name for name, directory in entries if directory]
