"""This machine's cache of published policy versions, bounded and shared between versions.

A published version's files are content-addressed in the store (`keys.policy_blob_key`), and
the learner writes weights one shard per layer (`infra.policy.save_weights`), so a version whose
training touched only the top layers shares most of its shards with the version before it. The
cache keeps that sharing on disk: each blob is downloaded (and verified) once, into `.blobs/`,
and a version's directory holds hard links to the blobs it names.

    local = fetch_policy(store, "run-1", 3, settings.policy_cache, keep=6)
    fd = pin(local)                                       # None: evicted meanwhile
    ...                                                   # read it: it stays until unpinned
    unpin(fd)
    with pinned_policy(store, "run-1", 3, settings.policy_cache, keep=6) as local:
        ...                                               # fetched and pinned under one lock
    forget_run(settings.policy_cache, "run-1")            # `tempered runs rm`

Layout under the cache directory:
  .blobs/<sha256>             a file of some version, verified against its manifest (a dot
                              name, which no run id has: `contracts.common.Identifier`)
  <run>/v<N>/<name>           hard links into .blobs/, plus the version's manifest.json
  .lock                       one file lock: fetches, evictions and removals take turns

A version directory that exists is complete: built in a temporary directory (a dot name,
`.v<N>.<hex>.tmp`, never taken for a version), fsynced (blobs before their rename: a host crash
left short blobs, trusted for ever) and renamed into place. It is served only while its
manifest.json is the store's (read once a process, `_checked`, `CHECKED_MAX` at most: another
bucket may hold another run under the same id) and its files have their manifest's sizes (a
stat each); else it is built again (a short blob downloaded again) and takes the old one's
place in one step (`_exchange`, renameat2's RENAME_EXCHANGE; where a file system cannot, EINVAL,
the old one is renamed aside first: missing between two renames).

A store that cannot be reached (`TransientStorageError`) does not stop a version cached complete
from being served (logged, not remembered in `_checked`); a version not cached fails, and one
the store says is missing (ObjectNotFound) or refuses to tell (PermanentStorageError) is never
served from the cache.

With `keep`, room is made before a version is downloaded (down to `keep - 1` others, then every
blob no version links to) and versions beyond `keep`, least recently used first (across runs),
are removed after each fetch. A disk that fills anyway (ENOSPC, EDQUOT) evicts every unpinned
version but the one fetched and its base, and the fetch is tried once more (eviction ran only
after a fetch: a full disk failed every later fetch). A version is used when it is fetched or
pinned (its directory's mtime); a full-weight version that a cached LoRA version names
(`adapter_of`) counts as used whenever that adapter was (read only through its adapters, it
went first, and every adapter over it stopped working). A removed version is fetched again.

A pinned version is not evicted: `pin` takes a shared `flock` on the version's directory, which
eviction takes exclusively without waiting and skips the version where it cannot (nor its
base), so the cache may hold more than `keep` while readers hold them. The lock belongs to the
open directory: it works across processes (the learner and the inference workers share the
cache) and ends with the process. What a killed fetch leaves (its temporary directory, or the
version a swap replaced) is removed by the next sweep, under the lock.

Not covered: a version directory is read-only by convention (its files are links to shared
blobs); `forget_run` removes a run's versions even while they are pinned (the run is gone), and
a rebuild removes the directory it replaced even while a reader has it pinned (its files were
another store's run under the same id: a reader of them was serving the wrong weights).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from filelock import FileLock

from contracts.common import is_identifier
from contracts.learner import PolicyManifest
from infra.policy import MANIFEST, PolicyIntegrityError, download_verified, policy_manifest
from infra.storage import ObjectNotFound, ObjectStore, TransientStorageError

BLOBS = ".blobs"
LEGACY_BLOBS = "blobs"  # before: a run named `blobs` shared the folder; its files are removed
LOCK = ".lock"
CHECKED_MAX = 4096
_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100
_FULL = (errno.ENOSPC, errno.EDQUOT)
_renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)  # glibc 2.28+
if _renameat2 is not None:
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p] * 2 + [ctypes.c_uint]
    _renameat2.restype = ctypes.c_int

log = logging.getLogger(__name__)

_checked: dict[tuple[str, str, str, int], PolicyManifest] = {}
"""The store's manifest of each version this process fetched, by endpoint, bucket, run and
version: read once, compared with the cached one at each fetch."""


def _version_dir(run_dir: Path, version: int) -> Path:
    """Where version `version` of the run whose folder is `run_dir` is cached."""
    return run_dir / f"v{version}"


def _store_manifest(store: ObjectStore, run_id: str, version: int) -> PolicyManifest:
    """The store's manifest of the version, read once per process (`_checked`)."""
    memo = (store.endpoint, store.bucket, run_id, version)
    manifest = _checked.get(memo)
    if manifest is None:
        manifest = policy_manifest(store, run_id, version)
        if manifest is None:
            raise ObjectNotFound(
                f"policy {run_id} v{version} was never published in {store.bucket}"
            )
        while len(_checked) >= CHECKED_MAX:
            del _checked[next(iter(_checked))]  # the oldest: it is read again if asked for
        _checked[memo] = manifest
    return manifest


def _cached_manifest(target: Path) -> PolicyManifest | None:
    try:
        return PolicyManifest.model_validate_json((target / MANIFEST).read_bytes())
    except (OSError, ValueError):  # not cached, or unreadable: built again
        return None


def fetch_policy(
    store: ObjectStore, run_id: str, version: int, cache_dir: Path, keep: int | None = None
) -> Path:
    """Version `version` of `run_id` as `cache_dir/<run>/v<version>/`, fetched once.

    Only blobs the cache lacks are downloaded. Raises ObjectNotFound if the version was never
    published, PolicyIntegrityError if a download does not match its manifest. With `keep`,
    at most that many versions stay cached afterwards (this one always among them).
    """
    return _fetch(store, run_id, version, Path(cache_dir), keep, pinned=False)[0]


@contextlib.contextmanager
def pinned_policy(
    store: ObjectStore, run_id: str, version: int, cache_dir: Path, keep: int | None = None
) -> Iterator[Path]:
    """`fetch_policy`, pinned (`pin`) under the cache's lock until the block ends: no fetch
    evicts it meanwhile (the learner's LoRA adapter, while it fetches the base)."""
    path, fd = _fetch(store, run_id, version, Path(cache_dir), keep, pinned=True)
    assert fd is not None  # `_fetch` raises where it cannot pin
    try:
        yield path
    finally:
        unpin(fd)


def _fetch(
    store: ObjectStore, run_id: str, version: int, cache: Path, keep: int | None, pinned: bool
) -> tuple[Path, int | None]:
    target = _version_dir(cache / run_id, version)
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(cache / LOCK):
        cached = _cached_manifest(target)
        try:
            manifest = _store_manifest(store, run_id, version)
        except TransientStorageError as err:
            if cached is None:
                raise
            log.warning(
                "policy %s v%d: served from the cache, the store is unreachable: %s",
                run_id,
                version,
                err,
            )
            manifest = cached  # not remembered in `_checked`: the next fetch asks again
        base = manifest.policy.adapter_of
        spare = None if base is None else _version_dir(target.parent, base)
        if cached != manifest or not _intact(target, manifest):  # not cached, another store's
            _build_with_room(store, manifest, target, keep, spare)  # run, or cut short
        _mark_used(target)
        _evict(cache, keep, target, spare)
        fd = pin(target) if pinned else None
        if pinned and fd is None:  # nothing removes a version without the lock: unreadable
            raise FileNotFoundError(f"policy {run_id} v{version}: {target} cannot be pinned")
    return target, fd


def _intact(target: Path, manifest: PolicyManifest) -> bool:
    """Whether each cached file has the size its manifest names (a stat, not every byte)."""
    return all(_sized(target / name, ref.size) for name, ref in manifest.files.items())


def _sized(path: Path, size: int) -> bool:
    try:
        return path.stat().st_size == size
    except OSError:
        return False


def _build_with_room(
    store: ObjectStore, manifest: PolicyManifest, target: Path, keep: int | None, spare: Path | None
) -> None:
    """`_build_version` after making room for it, and once more after evicting every unpinned
    version but `target` and `spare` (its base) if the disk fills."""
    cache = target.parent.parent
    needed = {ref.sha256 for ref in manifest.files.values()}  # kept: a failed try's downloads
    for attempt in range(2):
        _evict(cache, 1 if attempt else keep, target, spare, needed)
        try:
            return _build_version(store, manifest, cache, target)
        except Exception as err:
            if attempt or not _disk_full(err):
                raise
            log.warning("policy cache %s is full (%s): evicting all it can", cache, err)


def _disk_full(err: BaseException | None) -> bool:
    """Whether `err`, or an error it was raised from, says the disk (or a quota) is full."""
    while err is not None and not (isinstance(err, OSError) and err.errno in _FULL):
        err = err.__cause__ or err.__context__
    return err is not None


def pin(version_dir: Path) -> int | None:
    """Keep the cached version `version_dir` from eviction until `unpin` (or until this process
    ends), and mark it used now. Returns the pin, or None if the version is not cached (evicted
    meanwhile, or being evicted now): fetch it again."""
    try:
        fd = os.open(version_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # fails only while it is being removed
        locked, cached = os.fstat(fd), os.stat(version_dir)
        # the directory locked is still the one cached there (not one removed, then fetched again)
        if (locked.st_dev, locked.st_ino) == (cached.st_dev, cached.st_ino) and (
            Path(version_dir) / MANIFEST
        ).is_file():
            _mark_used(Path(version_dir))
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def unpin(fd: int) -> None:
    """End a pin `pin` returned."""
    os.close(fd)  # closing the directory releases its lock


def forget_run(cache_dir: Path, run_id: str) -> None:
    """Remove every cached version of `run_id`, then the blobs no other version links to (an id
    that is not one, `""` or `..`, is refused: it would name the whole cache or beyond)."""
    if not is_identifier(run_id):
        raise ValueError(f"{run_id!r} is not a run id")
    cache = Path(cache_dir)
    if not cache.is_dir():
        return
    with FileLock(cache / LOCK):
        shutil.rmtree(cache / run_id, ignore_errors=True)
        _remove_unlinked_blobs(cache)


def cached_versions(cache_dir: Path) -> list[Path]:
    """The complete version directories in the cache, in eviction order: least recently
    used first, a base named by cached adapters as recent as the most recent of them."""
    found = {
        version: version.stat().st_mtime_ns  # last used: `_mark_used`
        for run in Path(cache_dir).iterdir()
        if run.is_dir() and run.name != BLOBS
        for version in run.iterdir()
        if not version.name.startswith(".") and (version / MANIFEST).is_file()
    }
    used = dict(found)
    named: set[Path] = set()
    for version, fetched in found.items():
        base = _base_of(version)
        if base in found:
            named.add(base)
            used[base] = max(used[base], fetched)
    # a base ties with its newest adapter: the adapter sorts first, so it never outlives its base
    return sorted(found, key=lambda path: (used[path], path in named))


def _base_of(version: Path) -> Path | None:
    """The directory of the full-weight version a cached LoRA version applies to (None: full)."""
    manifest = _cached_manifest(version)  # None: removed by `forget_run` elsewhere, unreadable
    base = None if manifest is None else manifest.policy.adapter_of
    return None if base is None else _version_dir(version.parent, base)


def _build_version(store: ObjectStore, manifest: PolicyManifest, cache: Path, target: Path) -> None:
    blobs = cache / BLOBS
    blobs.mkdir(exist_ok=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}.tmp"
    aside = tmp.with_suffix(".old.tmp")  # the replaced version, where it cannot be exchanged
    try:
        tmp.mkdir()
        for name, ref in manifest.files.items():
            path = (tmp / name).resolve()
            if not path.is_relative_to(tmp.resolve()):
                raise PolicyIntegrityError(f"manifest entry {name!r} escapes the policy directory")
            blob = blobs / ref.sha256
            if not _sized(blob, ref.size):  # missing, or left short by a crash
                part = blobs / f".{ref.sha256}.{uuid.uuid4().hex[:8]}.part"
                try:
                    download_verified(store, ref, part, name)
                    _fsync(part)  # its bytes on disk before its name says it is complete
                    os.replace(part, blob)
                finally:
                    part.unlink(missing_ok=True)
            path.parent.mkdir(parents=True, exist_ok=True)
            os.link(blob, path)
        (tmp / MANIFEST).write_text(manifest.model_dump_json(indent=1))
        for synced in (tmp / MANIFEST, tmp, blobs):
            _fsync(synced)
        if not target.exists():
            os.rename(tmp, target)
        elif not _exchange(tmp, target):  # the old one is now at `tmp`
            os.rename(target, aside)
            os.rename(tmp, target)
        _fsync(target.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(aside, ignore_errors=True)


def _fsync(path: Path) -> None:
    """Flush a file's bytes, or a directory's entries, to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (renameat2's RENAME_EXCHANGE); False where this
    system or file system cannot (then nothing changed)."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _mark_used(version_dir: Path) -> None:
    # the clock's own resolution: a file system's "now" (utime without times) is as coarse as
    # the kernel's tick, and uses within one tick would tie
    now = time.time_ns()
    os.utime(version_dir, ns=(now, now))


def _evict(
    cache: Path, keep: int | None, fetched: Path, base: Path | None, needed: set[str] | None = None
) -> None:
    """Remove the least recently used unpinned versions until `keep - 1` others than `fetched`
    are left (never `base`, the version it applies to, nor the base of one that stays), then the
    blobs no version links to (always, given the blobs `needed` by a version not built yet)."""
    versions = [] if keep is None else [v for v in cached_versions(cache) if v != fetched]
    excess, removed = (0 if keep is None else len(versions) - (keep - 1)), 0
    spared = {base}  # the bases of versions that stay: adapters sort before them
    for version in versions:
        if removed >= excess:
            break
        if version not in spared and _remove_unpinned(version):
            removed += 1
        elif (named := _base_of(version)) is not None:
            spared.add(named)
    if excess > 0 or needed is not None:
        _remove_unlinked_blobs(cache, needed)


def _remove_unpinned(version: Path) -> bool:
    """Remove a cached version unless someone pins it (`pin`); whether it was removed."""
    try:
        fd = os.open(version, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        # held while the files go: a `pin` meanwhile fails, and its caller fetches again
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    try:
        shutil.rmtree(version, ignore_errors=True)
        with contextlib.suppress(OSError):  # the run's last cached version: drop its folder
            version.parent.rmdir()
    finally:
        os.close(fd)
    return True


def _remove_unlinked_blobs(cache: Path, needed: set[str] | None = None) -> None:
    """Blobs no version directory links to (but those named `needed`), and what a killed fetch
    left: its temporary directory, whose links would keep its blobs, and its downloads (a fetch
    holds the lock, so none is in flight here)."""
    for run in cache.iterdir():
        if run.is_dir() and run.name != BLOBS:
            for leftover in run.glob(".*.tmp"):  # `_build_version`'s temporary directories
                shutil.rmtree(leftover, ignore_errors=True)
            with contextlib.suppress(OSError):  # a run whose only entry was a leftover
                run.rmdir()
    for blobs in (cache / BLOBS, cache / LEGACY_BLOBS):
        if blobs.is_dir():
            for blob in blobs.iterdir():  # a run's folder holds only folders: v<N>, temporaries
                if blob.name in (needed or ()) or not blob.is_file():
                    continue
                if blob.name.endswith(".part") or blob.stat().st_nlink <= 1:
                    blob.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # emptied, or the folder of a run named `blobs`
        (cache / LEGACY_BLOBS).rmdir()
