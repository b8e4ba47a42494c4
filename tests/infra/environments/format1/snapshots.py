"""Trees on disk and in the object store: snapshot a workspace, restore one, fetch and store.

    trees = Trees(StoreObjects(store))                  # or Trees(MemoryObjects()) offline
    scanner = Scanner(max_bytes=256 << 20)
    entries, new = scanner.scan(workspace, previous.packed())   # reads changed files only
    ref, manifest = trees.commit(entries, new, previous, mtimes=scanner.mtimes)   # one PUT
    restore(manifest, trees.get_contents(manifest), fresh_dir, uid)   # `disk.py`

The workspace is written by sandboxed code, so the scan never follows a link and opens every
path relative to its parent's descriptor with O_NOFOLLOW: a link to /etc/shadow is stored as a
link, a FIFO is left out (`walk.py`), nothing outside the directory is ever read. A restore writes into a
fresh directory only, from a manifest that has nothing below a link (`tree.Manifest`), and
hands every path to the session's uid (`disk.restore`). A scan counts what a restore will
take of a workspace's tmpfs, so a tree it accepts always fits one again.

Blocking (file system, boto3): callers run these in a thread. The scan remembers each file's
(inode, size, times, mode) and its digest, so a step that changed one file reads one file; a
commit uploads one object, the manifest with the contents new since `previous` inline, so no
caller ever holds a ref to a manifest whose contents are missing; now and then it takes the
contents of a few small earlier objects in too (`packing.py`).

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from contracts.common import ObjectRef
from infra.environments.disk import DIR_FLAGS, FILE_FLAGS, PAGE, Parents, disk_bytes, link_bytes
from infra.environments.lru import Lru
from infra.environments.packing import still_needed, to_take
from infra.environments.paths import is_utf8
from infra.environments.tree import (
    Check,
    Entry,
    Manifest,
    Pack,
    TreeError,
    decode_tree,
    entry_mode,
    manifest_ref,
    sha256,
)
from infra.environments.walk import leave_out, walk
from infra.storage import ObjectNotFound, ObjectStore

MAX_ENTRIES = 100_000
"""Paths one workspace may hold."""
PARALLEL = 8
"""Pack downloads in flight at once."""
ENTRY_BYTES, FIELDS_BYTES, LISTED_BYTES, MTIME_BYTES = 768, 512, 288, 48
"""A little over what a decoded manifest takes in memory beside its paths (1,033 B measured
for a file's entry, listed content and mtime): each entry (a pydantic model, its dict and set
of the fields given, a digest's str), 512 B more for one given five fields or more (a file
that is executable, has a mode or is a hard link: that set outgrows its smallest table), each
content listed (a tuple, a digest, an int), each mtime."""
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


class Objects(Protocol):
    """Where stored bytes live: the object store, or a dict."""

    def get(self, key: str) -> bytes: ...

    def put(self, key: str, data: bytes) -> None: ...


class StoreObjects:
    """`Objects` in the S3 store (plain PUTs: every key is content-addressed)."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def get(self, key: str) -> bytes:
        return self.store.get_bytes(key)

    def put(self, key: str, data: bytes) -> None:
        self.store.put_bytes(key, data)


class MemoryObjects(dict[str, bytes]):
    """`Objects` in memory (validation without a store, tests)."""

    def get(self, key: str) -> bytes:  # type: ignore[override]
        try:
            return self[key]
        except KeyError:
            raise ObjectNotFound(key) from None

    def put(self, key: str, data: bytes) -> None:
        self[key] = data


class Trees:
    """Stored trees, with LRU caches (`lru.Lru`) of the contents and of the manifests this
    process read or wrote (all immutable: named by their digests), each of at most
    `cache_bytes`. Concurrent reads of one manifest or pack fetch it once (the G sessions of a
    group open from one initial tree). Before, manifests were kept by count (1,024 of up to
    100,000 entries each: tens of GB)."""

    def __init__(self, objects: Objects, cache_bytes: int = 256 << 20) -> None:
        self.objects = objects
        self.cache_bytes = cache_bytes
        self._contents: Lru[dict[str, bytes]] = Lru(cache_bytes)
        self._manifests: Lru[Manifest] = Lru(cache_bytes)
        self._pool = ThreadPoolExecutor(PARALLEL, thread_name_prefix="trees")

    def get_manifest(self, ref: ObjectRef) -> Manifest:
        """The manifest `ref` names, checked against its digest."""
        return self._manifests.load(ref.sha256, lambda: self._read_manifest(ref), manifest_bytes)

    def _read_manifest(self, ref: ObjectRef) -> Manifest:
        try:
            data = self.objects.get(ref.key)
        except ObjectNotFound:
            raise TreeError(f"no tree at {ref.key}") from None
        if sha256(data) != ref.sha256:
            raise TreeError(f"{ref.key} does not match its sha256 {ref.sha256[:12]}…")
        manifest, inline = decode_tree(data)
        if missing := manifest.contents() - manifest.packed():
            raise TreeError(f"{ref.key}: {len(missing)} contents are in none of its packs")
        if inline:
            self._remember(ref.sha256, inline)
        return manifest

    def get_contents(self, manifest: Manifest) -> dict[str, bytes]:
        """Digest → content of every file of `manifest` (its packs fetched in parallel)."""
        found = self._unpacked(manifest.all_packs())
        return {digest: found[digest] for digest in manifest.contents()}

    def commit(
        self, entries: list[Entry], new: Mapping[str, bytes], previous: Manifest | None,
        check: Check | None = None, mtimes: Mapping[str, int] | None = None,
    ) -> tuple[ObjectRef, Manifest]:  # fmt: skip
        """Store the tree `entries` (with `check`, and each file's time from `mtimes` if given:
        `Scanner.mtimes`) in one object: inline, the contents none of `previous`'s objects
        hold, from `new`, and those of the objects it takes in (`packing.py`)."""
        sizes = {entry.sha256: entry.size for entry in entries if entry.kind == "file"}
        kept = still_needed(previous.all_packs(), sizes) if previous else []
        fresh = sizes.keys() - {digest for pack in kept for digest, _ in pack.contents}
        if absent := [digest[:12] for digest in fresh if digest not in new]:
            raise TreeError(f"no bytes for the contents {absent} of the tree")
        inline = {digest: new[digest] for digest in fresh}
        if taken := to_take(kept, sizes, sum(map(len, inline.values()))):
            everything = {**self._unpacked(taken), **new}
            kept = [pack for pack in kept if pack not in taken]
            elsewhere = {digest for pack in kept for digest, _ in pack.contents}
            inline = {digest: everything[digest] for digest in sizes if digest not in elsewhere}
        listing = sorted(entries, key=lambda e: e.path)
        manifest = Manifest(
            entries=listing,
            mtimes=[mtimes[e.path] for e in listing if e.kind == "file"] if mtimes else [],
            packs=kept,
            inline=[(digest, len(inline[digest])) for digest in sorted(inline)],
            check=check,
        )
        ref, data = manifest_ref(manifest, inline)
        self.objects.put(ref.key, data)
        if inline:
            self._remember(ref.sha256, inline)
        return ref, manifest

    def _unpacked(self, packs: list[Pack]) -> dict[str, bytes]:
        """Every content of `packs`, from the cache or fetched in parallel."""
        cached = {
            p.sha256: held for p in packs if (held := self._contents.get(p.sha256)) is not None
        }
        missing = [pack for pack in packs if pack.sha256 not in cached]
        found: dict[str, bytes] = {}
        for contents in [*cached.values(), *self._pool.map(self._fetch, missing)]:
            found.update(contents)
        return found

    def _fetch(self, pack: Pack) -> dict[str, bytes]:
        def fetch() -> dict[str, bytes]:
            try:
                return pack.unpack(self.objects.get(pack.key))
            except ObjectNotFound:
                raise TreeError(f"pack {pack.key} of the tree is missing") from None

        return self._contents.load(pack.sha256, fetch, _contents_bytes)

    def _remember(self, digest: str, contents: dict[str, bytes]) -> None:
        self._contents.put(digest, contents, _contents_bytes(contents))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _contents_bytes(contents: dict[str, bytes]) -> int:
    return sum(map(len, contents.values()))


def manifest_bytes(manifest: Manifest) -> int:
    """About what `manifest` takes in memory, decoded (a little over: `ENTRY_BYTES`)."""
    entries = manifest.entries
    listed = len(manifest.inline) + sum(len(pack.contents) for pack in manifest.packs)
    return (
        ENTRY_BYTES * len(entries)
        + FIELDS_BYTES * sum(map(_five_fields, entries))
        + LISTED_BYTES * listed
        + MTIME_BYTES * len(manifest.mtimes)
        + sum(len(entry.path) + len(entry.target) for entry in entries)
    )


def _five_fields(entry: Entry) -> bool:
    """Whether `entry`, decoded, was given five fields or more (its stored JSON leaves defaults
    out): a file's path, kind, digest and size, and one more."""
    return entry.kind == "file" and (
        entry.executable or entry.mode is not None or bool(entry.target)
    )


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
