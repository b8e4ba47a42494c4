"""Trees on a worker's disk: what a restore writes, and what that takes of a workspace's quota.

    restore(manifest, contents, fresh_dir, uid)         # every path given to `uid`, its mode
    with Parents(root) as parents:                      # reach any path of a tree
        parent_fd, name = parents.of("a/b/c.txt")
    disk_bytes(size), link_bytes(target)                # what a restore takes of a tmpfs

Two things a scan (`snapshots.Scanner`) reads fine can break a restore unless both sides agree:

- Size. A workspace is a tmpfs (`mounts.py`), which charges each file whole pages and a long
  link's target one; a hard link takes no page, and a restore makes it a link again. The scan
  counts these costs, so a tree it accepts always fits the same quota again. (Trees stored
  before hard links were kept restore each as a file of its own: their scans counted each.)
- Path length. A path may pass PATH_MAX (4,096 bytes: 20 nested names of 250 letters), which a
  scan reads relative to each parent's descriptor, but which no call given the whole path can
  open (ENAMETOOLONG). A restore reaches every path the same way (`Parents`).

Measured on Linux 6.18's tmpfs (no huge pages): an empty file, a directory and a link of up to
127 bytes take no page; a hard link takes an inode (`nr_inodes` bounds those) but no page.

Modes: a file gets its mode as it is created (`os.fchmod`, whatever the umask), a directory
once all it holds is written, the deepest first: a worker that is not root could not write
into a 0555 directory, nor reach what a 0000 one holds.

Times: a file gets the time its tree keeps for it, or `tree.FIXED_MTIME_NS`; every directory
(listed or implied), link and the root get `FIXED_MTIME_NS`, a directory's set last, when
nothing is written into it any more. One state so restores alike every time.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from infra.environments.tree import FIXED_MTIME_NS, Entry, Manifest, TreeError

PAGE = max(4096, os.sysconf("SC_PAGESIZE"))
"""What a tmpfs charges a file for: each whole or partial page of its bytes."""
LONG_LINK = 127
"""Bytes of a link's target from which a tmpfs takes a page for it (shorter ones live in the
inode; a kernel that counts the target's NUL takes one from 127 bytes, Linux 6.18 from 128)."""
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
"""Opening a file the agent wrote: never through a link, never waiting (a FIFO put there)."""


def disk_bytes(size: int) -> int:
    """What a file of `size` bytes takes of a workspace's tmpfs: whole pages (none if empty)."""
    return -(-size // PAGE) * PAGE


def link_bytes(target: str) -> int:
    """What a link to `target` takes of a workspace's tmpfs."""
    return PAGE if len(target.encode()) >= LONG_LINK else 0


class Parents:
    """Descriptors of the directories from a root down to the one last asked for, so each path
    of a tree is reached relative to its parent's, whatever its length. Entries come in path
    order, so the stack moves a few levels between them; never a link is followed."""

    def __init__(self, root: Path, make: bool = False, uid: int | None = None) -> None:
        self.make, self.uid = make, uid
        """`make`: create missing directories (a manifest need not list every parent), given
        to `uid` (None: as they are)."""
        self._stack: list[tuple[str, int]] = [("", os.open(root, DIR_FLAGS))]

    def of(self, path: str) -> tuple[int, str]:
        """The open parent directory of `path`, and the last name of `path`."""
        directory, _, name = path.rpartition("/")
        while not _below(directory, self._stack[-1][0]):
            os.close(self._stack.pop()[1])
        top, fd = self._stack[-1]
        below = directory[len(top) :].lstrip("/")
        for part in below.split("/") if below else []:
            if self.make:
                mkdir(part, fd, self.uid)
            fd = os.open(part, DIR_FLAGS, dir_fd=fd)
            top = f"{top}/{part}" if top else part
            self._stack.append((top, fd))
        return fd, name

    def __enter__(self) -> Parents:
        return self

    def __exit__(self, *_: object) -> None:
        while self._stack:
            os.close(self._stack.pop()[1])


def _below(directory: str, top: str) -> bool:
    """Whether `directory` is `top` or lies below it (everything lies below the root, "")."""
    return not top or directory == top or directory.startswith(top + "/")


def mkdir(name: str, dir_fd: int, uid: int | None) -> None:
    """Make the directory `name` (if it is missing) and give it to `uid` (None: as is)."""
    try:
        os.mkdir(name, 0o755, dir_fd=dir_fd)
    except FileExistsError:
        return
    if uid is not None:
        os.chown(name, uid, uid, dir_fd=dir_fd, follow_symlinks=False)


def restore(manifest: Manifest, contents: Mapping[str, bytes], root: Path, uid: int | None) -> None:
    """Write the tree into `root` (which must be empty), each file with its time
    (`Manifest.file_times`), each path with its mode, hard links as links, directories, links
    and `root` at `FIXED_MTIME_NS`, and hand it to `uid` (None: as is)."""
    if any(root.iterdir()):
        raise TreeError(f"{root} is not empty")
    if uid is not None:
        os.chown(root, uid, uid)
    mtimes = iter(manifest.file_times())  # one a file, in order
    directories: dict[str, Entry | None] = {}  # path → its entry (None: implied by a path)
    with Parents(root, make=True, uid=uid) as parents, Parents(root) as firsts:
        for entry in manifest.entries:
            parent_fd, name = parents.of(entry.path)
            for directory in _ancestors(entry.path):
                directories.setdefault(directory, None)
            if entry.kind == "dir":
                mkdir(name, parent_fd, uid)
                directories[entry.path] = entry
            elif entry.kind == "link":
                os.symlink(entry.target, name, dir_fd=parent_fd)
                if uid is not None:
                    os.chown(name, uid, uid, dir_fd=parent_fd, follow_symlinks=False)
                fixed = (FIXED_MTIME_NS, FIXED_MTIME_NS)
                os.utime(name, ns=fixed, dir_fd=parent_fd, follow_symlinks=False)
            elif entry.target:  # a hard link: the file, its owner, mode and mtime are written
                next(mtimes)
                first_fd, first = firsts.of(entry.target)
                os.link(
                    first, name, src_dir_fd=first_fd, dst_dir_fd=parent_fd, follow_symlinks=False
                )
            else:
                _write(name, parent_fd, entry, contents[entry.sha256], uid, next(mtimes))
    with Parents(root) as parents:
        # a path sorts after its parent's: in reverse, each directory comes before its parent,
        # whose time its own chmod and utime leave as they are
        for path in sorted(directories, reverse=True):
            parent_fd, name = parents.of(path)
            fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
            try:
                if (listed := directories[path]) is not None:
                    os.fchmod(fd, listed.permissions())
                os.utime(fd, ns=(FIXED_MTIME_NS, FIXED_MTIME_NS))
            finally:
                os.close(fd)
    os.utime(root, ns=(FIXED_MTIME_NS, FIXED_MTIME_NS))


def _ancestors(path: str) -> list[str]:
    """The directories `path` lies in, below the root ("a/b/c" → ["a", "a/b"])."""
    parts = path.split("/")[:-1]
    return ["/".join(parts[: n + 1]) for n in range(len(parts))]


def _write(name: str, dir_fd: int, entry: Entry, data: bytes, uid: int | None, mtime: int) -> None:
    """Create the file `name` in the open directory `dir_fd`, with its mode and `mtime`."""
    mode = entry.permissions()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, mode, dir_fd=dir_fd)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(fd, mode)  # whatever the umask
        if uid is not None:
            os.fchown(fd, uid, uid)
        handle.write(data)
        handle.flush()  # the time after the last write
        os.utime(fd, ns=(mtime, mtime))
