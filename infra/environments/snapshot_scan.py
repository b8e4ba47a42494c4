"""Scan a workspace for a snapshot, reading only the files that changed since the last scan.

    scanner = Scanner(max_bytes=256 << 20)
    entries, new = scanner.scan(workspace, previous.packed())   # reads changed files only
    scanner.prime(restored, manifest)           # after a restore: its files are not read again

The workspace is written by sandboxed code, so the scan never follows a link and opens every
path relative to its parent's descriptor with O_NOFOLLOW: a link to /etc/shadow is stored as a
link, a FIFO is left out (`walk.py`), nothing outside the directory is ever read. A scan counts
what a restore will take of a workspace's tmpfs, so a tree it accepts always fits one again.
Blocking (file system): callers run it in a thread. The scan remembers each file's (inode,
size, times, mode) and its digest, so a step that changed one file reads one file. Storing
what it found is `snapshots.Trees.commit`'s.

A stat proves a file's bytes only once the clock has passed its times (git's "racily clean"
files): before Linux 6.13 file times come from a clock that moves once a tick (1 to 10 ms), so
a same-size rewrite in the tick of a scan leaves the stat as it was. A file whose times are not
older than a scan's start by `RACY_NS` is read again by the next scan (`_settled`).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from infra.environments.disk import DIR_FLAGS, FILE_FLAGS, PAGE, Parents, disk_bytes, link_bytes
from infra.environments.paths import is_utf8
from infra.environments.tree import Entry, Manifest, TreeError, entry_mode, sha256
from infra.environments.walk import leave_out, walk

MAX_ENTRIES = 100_000
"""Paths one workspace may hold."""
CLOCK_REALTIME_COARSE = 5
"""Linux's id (unnamed in `time`) of the clock file times come from (from 6.13: it or later)."""
RACY_NS = round(time.clock_getres(CLOCK_REALTIME_COARSE) * 1e9)
"""How much older than a scan's start a file's times must be for its stat to be trusted: one
tick of that clock (4 ms at HZ=250). Older than the clock is exact on tmpfs, ext4, xfs (1 ns
times); the tick covers file systems that round times down by up to a tick (CIFS: 100 ns), not
those of 1 or 2 s (FAT), which no workspace is on."""
SETTLE_NS, REREAD_BYTES = 10 * RACY_NS, 8 << 20
"""`prime` waits at most `SETTLE_NS`, and only for files that would cost more than
`REREAD_BYTES` (a page each, plus their bytes: some ms of reading, as long as the wait) to read."""


def coarse_now() -> int:
    """Now (ns) by that clock: a file written later has times at least this late."""
    return time.clock_gettime_ns(CLOCK_REALTIME_COARSE)


StatKey = tuple[int, int, int, int, int]


class Scanner:
    """Snapshots one directory again and again, reading only the files that changed."""

    def __init__(self, max_bytes: int, max_entries: int = MAX_ENTRIES) -> None:
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self.clock: Callable[[], int] = coarse_now  # what file times are compared with
        self.mtimes: dict[str, int] = {}
        """Each file's mtime (ns) at the last scan (path → ns), for `Trees.commit`."""
        self.unkept: list[str] = []
        """What the last scan could not keep (`walk`), printable paths: removed if it pruned."""
        self._digests: dict[str, tuple[StatKey, str]] = {}

    def scan(
        self, root: Path, stored: Collection[str], prune: bool = False
    ) -> tuple[list[Entry], dict[str, bytes]]:
        """The entries of the tree under `root`, and the contents of its files that are not
        already `stored` (digests); with `prune`, what no snapshot can keep is removed from
        `root` (`walk`). TreeError past `max_bytes` or `max_entries`."""
        self.unkept = []
        entries: list[Entry] = []
        blobs: dict[str, bytes] = {}
        seen: dict[str, tuple[StatKey, str]] = {}
        mtimes: dict[str, int] = {}
        linked: dict[str, tuple[int, int]] = {}  # path → (device, inode) of a file of 2+ links
        met: set[tuple[int, int]] = set()
        total = 0
        start = self.clock()
        fd = os.open(root, DIR_FLAGS)
        try:
            for path, parent_fd, name, info in walk(fd, self.unkept, prune):
                if len(entries) >= self.max_entries:
                    raise TreeError(f"the workspace holds more than {self.max_entries} paths")
                if stat.S_ISDIR(info.st_mode):
                    mode, _ = entry_mode("dir", info.st_mode)
                    entries.append(Entry(path=path, kind="dir", mode=mode))
                elif stat.S_ISLNK(info.st_mode):
                    target = os.readlink(name, dir_fd=parent_fd)
                    if not is_utf8(target):  # left out, as a name that is not UTF-8 is
                        leave_out(parent_fd, name, path, self.unkept, prune)
                        continue
                    total = self._charge(total, link_bytes(target))
                    entries.append(Entry(path=path, kind="link", target=target))
                else:
                    inode = (info.st_dev, info.st_ino)
                    if info.st_nlink == 1 or inode not in met:  # a further path: a link, no page
                        total = self._charge(total, disk_bytes(info.st_size))
                    if info.st_nlink > 1:
                        met.add(inode)
                        linked[path] = inode
                    digest, data = self._digest(path, parent_fd, name, info, stored)
                    if data is not None:
                        blobs[digest] = data
                    if _settled(info, start):
                        seen[path] = (_stat_key(info), digest)
                    mtimes[path] = info.st_mtime_ns
                    mode, executable = entry_mode("file", info.st_mode)
                    entries.append(
                        Entry(
                            path=path,
                            kind="file",
                            sha256=digest,
                            size=info.st_size,
                            executable=executable,
                            mode=mode,
                        )  # fmt: skip
                    )
        except PermissionError as exc:  # a worker that is not root, and a `chmod 000` of its agent
            raise TreeError(
                f"{exc.filename}: the worker may not read it ({exc.strerror})"
            ) from None
        finally:
            os.close(fd)
        self._digests, self.mtimes = seen, mtimes
        return _hard_links(entries, linked), blobs

    def _charge(self, total: int, cost: int) -> int:
        """`total` plus `cost`; TreeError past `max_bytes`. Costs are what a restore will take
        of a tmpfs (`disk.py`), not `st_size`: 1,000 one-byte files are 1 KB to `du` but 1,000
        pages once restored."""
        total += cost
        if total > self.max_bytes:
            raise TreeError(
                f"the workspace holds more than {self.max_bytes >> 20} MB (each file counted in "
                f"whole {PAGE >> 10} KiB pages)"
            )
        return total

    def _digest(
        self, path: str, parent_fd: int, name: str, info: os.stat_result,
        stored: Collection[str],
    ) -> tuple[str, bytes | None]:  # fmt: skip
        """The file's digest, and its bytes unless they are already stored."""
        remembered = self._digests.get(path)
        if remembered is not None and remembered[0] == _stat_key(info) and remembered[1] in stored:
            return remembered[1], None
        fd = os.open(name, FILE_FLAGS, dir_fd=parent_fd)
        try:
            opened = os.fstat(fd)
            if not stat.S_ISREG(opened.st_mode) or opened.st_ino != info.st_ino:
                raise TreeError(f"{path!r} changed while it was read")
            with os.fdopen(os.dup(fd), "rb") as handle:
                data = handle.read(info.st_size + 1)
        finally:
            os.close(fd)
        if len(data) != info.st_size:
            raise TreeError(f"{path!r} changed while it was read")
        digest = sha256(data)
        return digest, None if digest in stored else data

    def prime(self, root: Path, manifest: Manifest) -> None:
        """Remember the digests of a tree just restored under `root`, for the next scan not to
        read it. Its files are as recent as the clock, their stats not yet trusted: if reading
        them again would cost more than `REREAD_BYTES`, wait (at most `SETTLE_NS`) for the clock
        to pass them; files still too recent are read by the next scan."""
        files = manifest.files()
        start, infos = self._stat(root, files)
        recent = [info for info in infos if not _settled(info, start)]
        if sum(PAGE + info.st_size for info in recent) > REREAD_BYTES:
            newest = max(max(info.st_mtime_ns, info.st_ctime_ns) for info in recent)
            if self._wait_past(newest + RACY_NS):
                start, infos = self._stat(root, files)
        self._digests = {
            entry.path: (_stat_key(info), entry.sha256)
            for entry, info in zip(files, infos, strict=True)
            if _settled(info, start)
        }

    def _stat(self, root: Path, files: list[Entry]) -> tuple[int, list[os.stat_result]]:
        """The clock, then the stat of each of `files` under `root`."""
        start, infos = self.clock(), []
        with Parents(root) as parents:
            for entry in files:
                parent_fd, name = parents.of(entry.path)
                infos.append(os.stat(name, dir_fd=parent_fd, follow_symlinks=False))
        return start, infos

    def _wait_past(self, moment: int) -> bool:
        """Sleep until the clock is past `moment` (True), or for `SETTLE_NS` (False)."""
        deadline = time.monotonic_ns() + SETTLE_NS
        while (now := self.clock()) <= moment:
            left = deadline - time.monotonic_ns()
            if left <= 0:
                return False
            time.sleep(min(left, max(moment - now, RACY_NS // 4)) / 1e9)  # it moves by ticks
        return True


def _hard_links(entries: list[Entry], linked: Mapping[str, tuple[int, int]]) -> list[Entry]:
    """`entries` in path order, each further path of a file (the same inode, and the same
    content and mode: one read while it changed is a file of its own) a hard link to its
    first."""
    entries.sort(key=lambda entry: entry.path)
    if not linked:
        return entries
    firsts: dict[tuple[int, int, str, int | None], str] = {}
    for n, entry in enumerate(entries):
        if (inode := linked.get(entry.path)) is not None:
            first = firsts.setdefault((*inode, entry.sha256, entry.mode), entry.path)
            if first != entry.path:
                entries[n] = Entry(**{**entry.model_dump(exclude_defaults=True), "target": first})
    return entries


def _stat_key(info: os.stat_result) -> StatKey:
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_mode)


def _settled(info: os.stat_result, start: int) -> bool:
    """Whether any later write changes the file's times, at a scan that began at `start`."""
    return max(info.st_mtime_ns, info.st_ctime_ns) < start - RACY_NS
