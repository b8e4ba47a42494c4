"""Trees on a worker's disk: what a restore writes, and what that takes of a workspace's quota.

    restore(manifest, contents, fresh_dir, uid)         # every path given to `uid`
    with Parents(root) as parents:                      # reach any path of a tree
        parent_fd, name = parents.of("a/b/c.txt")
    disk_bytes(size), link_bytes(target)                # what a restore takes of a tmpfs

Two things a scan (`snapshots.Scanner`) reads fine can break a restore unless both sides agree:

- Size. A workspace is a tmpfs (`mounts.py`), which charges each file whole pages and a long
  link's target one, and a restore writes every path as a file of its own: 70,000 hard links
  to a one-byte file are 70 KB to `st_size` but 70,000 pages once restored. The scan counts
  these costs, so a tree it accepts always fits the same quota again.
- Path length. A path may pass PATH_MAX (4,096 bytes: 20 nested names of 250 letters), which a
  scan reads relative to each parent's descriptor, but which no call given the whole path can
  open (ENAMETOOLONG). A restore reaches every path the same way (`Parents`).

Measured on Linux 6.18's tmpfs (no huge pages): an empty file, a directory and a link of up to
127 bytes take no page; a hard link takes an inode (`nr_inodes` bounds those) but no page.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from infra.environments.tree import Manifest, TreeError

PAGE = max(4096, os.sysconf("SC_PAGESIZE"))
"""What a tmpfs charges a file for: each whole or partial page of its bytes."""
LONG_LINK = 127
"""Bytes of a link's target from which a tmpfs takes a page for it (shorter ones live in the
inode; a kernel that counts the target's NUL takes one from 127 bytes, Linux 6.18 from 128)."""
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


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
    """Write the tree into `root` (which must be empty), each file with the mtime it keeps, and
    hand it to `uid` (None: as is)."""
    if any(root.iterdir()):
        raise TreeError(f"{root} is not empty")
    if uid is not None:
        os.chown(root, uid, uid)
    mtimes = iter(manifest.mtimes)  # one a file, in order (none: the current time)
    with Parents(root, make=True, uid=uid) as parents:
        for entry in manifest.entries:
            parent_fd, name = parents.of(entry.path)
            if entry.kind == "dir":
                mkdir(name, parent_fd, uid)
            elif entry.kind == "link":
                os.symlink(entry.target, name, dir_fd=parent_fd)
                if uid is not None:
                    os.chown(name, uid, uid, dir_fd=parent_fd, follow_symlinks=False)
            else:
                mode = 0o755 if entry.executable else 0o644
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(name, flags, mode, dir_fd=parent_fd)
                with os.fdopen(fd, "wb") as handle:
                    os.fchmod(fd, mode)  # whatever the umask
                    if uid is not None:
                        os.fchown(fd, uid, uid)
                    handle.write(contents[entry.sha256])
                    if (mtime := next(mtimes, None)) is not None:  # after the last write
                        handle.flush()
                        os.utime(fd, ns=(mtime, mtime))
