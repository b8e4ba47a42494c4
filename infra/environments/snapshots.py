"""Trees on disk and in the object store: snapshot a workspace, restore one, fetch and store.

    trees = Trees(StoreObjects(store))                  # or Trees(MemoryObjects()) offline
    scanner = Scanner(max_bytes=256 << 20)              # `snapshot_scan.py`
    entries, new = scanner.scan(workspace, previous.packed())   # reads changed files only
    ref, manifest = trees.commit(entries, new, previous, mtimes=scanner.mtimes)   # one PUT
    restore(manifest, trees.get_contents(manifest), fresh_dir, uid)   # `disk.py`

A restore writes into a fresh directory only, from a manifest that has nothing below a link
(`tree.Manifest`), and hands every path to the session's uid (`disk.restore`); the scan never
follows a link (`snapshot_scan.py`).

Blocking (file system, boto3): callers run these in a thread. A commit uploads one object: the
tree's changes since an earlier snapshot of its episode, or now and then the whole tree
(`snapshot_chain.py`: a step that changed one file of 1,000 uploads some hundreds of bytes, not
94 KB), with the contents new since `previous` inline, so no caller ever holds a ref to a
manifest whose contents are missing; now and then it takes the contents of a few small earlier
objects in too (`packing.py`). A commit reads nothing back: the manifest it is stored against
is `previous` or one `previous` holds (`snapshot_chain.Snapshot`). A restore reads the tree's
object, those it is stored against (at most log2 of the steps since its last whole one, fewer
where this process holds one) and the objects holding its contents, in parallel. With
`snapshot_format=1` a commit stores the whole manifest among the shared trees, as builds
before format 2 did (they read nothing else: an upgrade's setting).
"""

from __future__ import annotations

from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from contracts.common import ObjectRef
from infra import keys
from infra.environments import snapshot_chain as chain
from infra.environments.lru import Lru
from infra.environments.packing import still_needed, to_take
from infra.environments.snapshot_scan import (  # where they were before: imported from here
    MAX_ENTRIES as MAX_ENTRIES,
)
from infra.environments.snapshot_scan import RACY_NS as RACY_NS
from infra.environments.snapshot_scan import Scanner as Scanner
from infra.environments.snapshot_scan import coarse_now as coarse_now
from infra.environments.tree import (
    Check,
    Entry,
    Manifest,
    Pack,
    TreeError,
    decode_tree,
    manifest_ref,
    sha256,
)
from infra.storage import ObjectNotFound, ObjectStore

PARALLEL = 8
"""Pack downloads in flight at once."""
ENTRY_BYTES, FIELDS_BYTES, LISTED_BYTES, MTIME_BYTES = 768, 512, 288, 48
"""A little over what a decoded manifest takes in memory beside its paths (1,033 B measured
for a file's entry, listed content and mtime): each entry (a pydantic model, its dict and set
of the fields given, a digest's str), 512 B more for one given five fields or more (a file
that is executable, has a mode or is a hard link: that set outgrows its smallest table), each
content listed (a tuple, a digest, an int), each mtime."""


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
    process read or wrote (all immutable: contents by their digests, manifests by their keys
    and digests, as one tree may lie in two episodes' folders), each of at most
    `cache_bytes`. Concurrent reads of one manifest or pack fetch it once (the G sessions of a
    group open from one initial tree). Before, manifests were kept by count (1,024 of up to
    100,000 entries each: tens of GB)."""

    def __init__(
        self, objects: Objects, cache_bytes: int = 256 << 20, snapshot_format: int = 2
    ) -> None:
        self.objects = objects
        self.cache_bytes = cache_bytes
        self.snapshot_format = snapshot_format
        """What `commit` writes: 2, or 1 for builds before format 2 (`WorkspaceSettings`)."""
        self._contents: Lru[dict[str, bytes]] = Lru(cache_bytes)
        self._manifests: Lru[Manifest] = Lru(cache_bytes)
        self._pool = ThreadPoolExecutor(PARALLEL, thread_name_prefix="trees")

    def get_manifest(self, ref: ObjectRef) -> Manifest:
        """The manifest `ref` names, checked against its digest."""
        return self._manifests.load(_named(ref), lambda: self._read_manifest(ref), manifest_bytes)

    def _read_manifest(self, ref: ObjectRef) -> Manifest:
        """The tree at `ref`: of format 1, or rebuilt from its chain of format-2 objects back
        to a whole tree, a tree of format 1, or one this process holds."""
        stored = self._stored(ref)
        head = chain.head_of(stored)
        if head is None:
            manifest, inline = decode_tree(stored)
            if inline:
                self._remember(ref.sha256, inline)
            return self._complete(ref, manifest)
        levels, root = [(ref, head, stored)], None
        while (base := head.base) is not None:
            if (root := self._manifests.get(_named(base))) is not None:
                break
            stored = self._stored(base)
            below = chain.head_of(stored)
            if below is None:
                root = self.get_manifest(base)
                break
            if below.position >= head.position:
                raise TreeError(f"{ref.key}: its chain does not lead to a whole tree")
            head = below
            levels.append((base, head, stored))
        levels.reverse()
        manifest = chain.rebuild(root, [(at, level) for at, level, _ in levels])
        held = {pack.sha256: pack for pack in manifest.all_packs()}
        for at, _, stored in levels:  # what a restore fetches next: read already
            if (pack := held.get(at.sha256)) is not None:
                self._remember(at.sha256, pack.unpack(stored))
        return self._complete(ref, manifest)

    def _stored(self, ref: ObjectRef) -> bytes:
        try:
            data = self.objects.get(ref.key)
        except ObjectNotFound:
            raise TreeError(f"no tree at {ref.key}") from None
        if sha256(data) != ref.sha256:
            raise TreeError(f"{ref.key} does not match its sha256 {ref.sha256[:12]}…")
        return data

    @staticmethod
    def _complete(ref: ObjectRef, manifest: Manifest) -> Manifest:
        if missing := manifest.contents() - manifest.packed():
            raise TreeError(f"{ref.key}: {len(missing)} contents are in none of its packs")
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
        hold, from `new`, and those of the objects it takes in (`packing.py`, and any a
        snapshot committed now may not name: `chain.in_reach`). Of `snapshot_format` 1: whole,
        among the shared trees, naming only objects at their shared keys (as builds before
        format 2 stored it: they read nothing else)."""
        format_1 = self.snapshot_format == 1
        sizes = {entry.sha256: entry.size for entry in entries if entry.kind == "file"}
        kept = still_needed(previous.all_packs(), sizes) if previous else []
        fresh = sizes.keys() - {digest for pack in kept for digest, _ in pack.contents}
        if absent := [digest[:12] for digest in fresh if digest not in new]:
            raise TreeError(f"no bytes for the contents {absent} of the tree")
        inline = {digest: new[digest] for digest in fresh}
        taken = to_take(kept, sizes, sum(map(len, inline.values())))
        taken += [
            pack for pack in kept
            if pack not in taken and not _reachable(pack, folder=not format_1)
        ]  # fmt: skip
        if taken:
            everything = {**self._unpacked(taken), **new}
            kept = [pack for pack in kept if pack not in taken]
            elsewhere = {digest for pack in kept for digest, _ in pack.contents}
            inline = {digest: everything[digest] for digest in sizes if digest not in elsewhere}
        listing = chain.shared_entries(sorted(entries, key=lambda e: e.path), previous)
        fields = dict(
            entries=listing,
            mtimes=[mtimes[e.path] for e in listing if e.kind == "file"] if mtimes else [],
            inline=[(digest, len(inline[digest])) for digest in sorted(inline)],
            check=check,
        )
        if format_1:
            manifest = Manifest(
                **fields, packs=[Pack(**p.model_dump(exclude={"at"})) for p in kept]
            )
            ref, data = manifest_ref(manifest, inline)
        else:
            manifest = chain.Snapshot(**fields, packs=kept)
            ref, data = chain.encode(manifest, inline, previous, self.get_manifest)
        self.objects.put(ref.key, data)
        if inline:
            self._remember(ref.sha256, inline)
        self._manifests.put(_named(ref), manifest, manifest_bytes(manifest))  # a later base
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


def _named(ref: ObjectRef) -> str:
    """What the manifest cache holds `ref`'s tree by: its key (identical snapshots of two
    episodes lie in two folders, each naming its own; before, the digest alone handed one
    episode the other's) and its digest (checked when read)."""
    return f"{ref.key} {ref.sha256}"


def _reachable(pack: Pack, folder: bool) -> bool:
    """Whether a snapshot committed now may name `pack`: at its shared key, or (`folder`:
    format 2) in the episode's folder (`chain.in_reach`)."""
    shared = keys.tree_key(pack.sha256) if pack.tree else keys.pack_key(pack.sha256)
    return pack.key == shared if not folder else chain.in_reach(pack.key, shared)


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
