"""Snapshots stored as the changes since an earlier one: format 2 of a stored tree.

    with episode_folder(run, task, sample):               # an activity's step: whose snapshot
        ref, data = encode(manifest, inline, previous, base_of)       # `Trees.commit`
    head = head_of(stored)                                 # None: format 1 (`tree.py`)
    manifest = rebuild(root, [(ref, head), ...])           # `Trees.get_manifest`, oldest first

Before, every snapshot held the whole manifest (some 90 B a file, compressed), so a step that
changed one file of 1,000 uploaded 94 KB. Format 2 keeps format 1's framing (zlib of a JSON
line, then the contents new in the tree, so `Pack.unpack` reads its contents alike) with a
`Head` for the line: either the whole tree (`base` None: every entry, each file's time and the
objects holding the contents) or the changes since `base`, an earlier tree of the episode:
the entries added or changed (a file whose only change is its time among them), the paths
removed, and the objects holding contents, each one of the base's by its place in
`base.all_packs()`, or given whole. Format 1 is still read: the tasks' trees, and the snapshots
of older builds (a run in flight during an upgrade), which a delta may have for its base.

Which base: skip deltas (Subversion's FSFS). The n-th snapshot after a whole one (its
`position`) is stored against the one at n with its lowest set bit cleared, so a restore reads
popcount(n) + 1 objects (at most log2(n) + 2) back to a whole tree, fewer where the process
holds one, and a snapshot holds the changes of lowbit(n) steps: an odd step its own, on average
some (log2 n) / 2 steps'. Every base a commit needs is on the chain of the snapshot before it
(n - 1's holds n & (n - 1)), which the manifest carries (`chain_of`). A tree is stored whole when its changes would name more than half
of its entries, and where they cannot give the times (one tree keeps times, the other none: a
task's tree, so an episode's first snapshot is whole).

Where: when the caller names the episode (`episode_folder`: a context variable, which the
threads of `asyncio.to_thread` inherit), in the episode's folder (`keys.episode_snapshots_prefix`)
under its digest, which the run's retention deletes (infra/retention.py); a tree that goes on
using such an object's contents names its key (`Held.at`). Else among the shared trees
(`keys.tree_key`), as before. A snapshot names objects of its own episode's folder and the
shared ones only (`in_reach`): a base elsewhere (a state another episode stored) makes it
whole, and contents elsewhere are taken in (`Trees.commit`). Each object is written once (its
key is its digest), after its base, and a ref is handed out only once its object is stored: a
crash leaves an object no ref names, never a ref whose tree restores wrong.

A committed or rebuilt snapshot holds the trees of its chain it was made with (`_bases`,
sharing their unchanged entries: `shared_entries`), so a session's next commit reads nothing
back, whatever the size of its tree.

Upgrades: a build before this one cannot read format 2 ("not a tree manifest", which its
worker fails the task for): while such sandbox workers run, `Trees(snapshot_format=1)`
(`sandbox.workspaces.snapshot_format`) writes format 1 as they did, among the shared trees.
The hidden tests and the tasks' trees are stored whole, once (`pack_files`).

Not covered: such a worker given a snapshot of format 2 written before the setting was lowered
still fails its open.
"""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from contracts.common import ObjectRef
from infra import keys
from infra.environments.tree import (
    COMPRESSION_LEVEL,
    Check,
    Entry,
    Manifest,
    Pack,
    TreeError,
    sha256,
)

FORMAT_2 = b'{"version":2'
"""How a format-2 object's JSON begins, then `,` or `}` (format 1 leaves its version, the
default, out)."""
Chain = tuple[tuple[int, ObjectRef], ...]
"""(position, ref) of a tree and of the trees it is stored against, down to a whole one."""

_folder: ContextVar[str | None] = ContextVar("snapshot_folder", default=None)


@contextlib.contextmanager
def episode_folder(run: str, task: str, sample: int) -> Iterator[None]:
    """Store the snapshots committed in this context (and the threads it starts) in the folder
    of the episode `sample` of `task` in `run`."""
    token = _folder.set(keys.episode_snapshots_prefix(run, task, sample))
    try:
        yield
    finally:
        _folder.reset(token)


class Held(Pack):
    """An object holding contents, which may lie elsewhere than its digest's shared key."""

    at: str = ""
    """Its key, where it is not `Pack.key` (a snapshot in an episode's folder)."""

    @property
    def key(self) -> str:
        return self.at or super().key


class Snapshot(Manifest):
    """A tree of format 2, as read or committed: its own object may lie in an episode's
    folder, and it knows the trees a later delta may be stored against, and holds those it
    was committed or rebuilt with."""

    _chain: Chain = PrivateAttr(default=())
    _bases: dict[str, Manifest] = PrivateAttr(default_factory=dict)
    """Trees of `_chain` below this one (key → tree): a session holding its last snapshot
    holds what its next steps are stored against, where the worker's cache may not (a tree
    over a quarter of it is never kept there: every other commit read its base's chain)."""

    def all_packs(self) -> list[Pack]:
        packs = super().all_packs()
        stored = self._stored
        if self.inline and stored is not None and packs[-1].key != stored.key:
            packs[-1] = Held(**packs[-1].model_dump(), at=stored.key)
        return packs


def chain_of(manifest: Manifest) -> Chain:
    """Where `manifest` is and what it is stored against (a tree of format 1 against nothing)."""
    if isinstance(manifest, Snapshot) and manifest._chain:
        return manifest._chain
    if manifest._stored is None:
        raise TreeError("the manifest is not stored yet")
    return ((0, manifest._stored),)


class Head(BaseModel):
    """The JSON line of a format-2 object."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[2]
    base: ObjectRef | None = None
    """The tree it is stored against; None: stored whole."""
    position: int = Field(default=0, ge=0)
    """Snapshots since the last whole one (0: this one)."""
    entries: list[Entry] = []
    """In path order: every entry (whole), or those added or changed since `base`."""
    mtimes: list[int] = []
    """Each file's time (ns) among `entries`, in order; none if the tree keeps none."""
    removed: list[str] = []
    """Paths of `base` that are gone."""
    packs: list[int | Held] = []
    """The objects holding contents: one of `base.all_packs()` by its place, or given whole."""
    inline: list[tuple[str, int]] = []
    """(digest, size) of the contents after the JSON line."""
    check: Check | None = None


def encode(
    manifest: Snapshot, inline: Mapping[str, bytes], previous: Manifest | None,
    base_of: Callable[[ObjectRef], Manifest],
) -> tuple[ObjectRef, bytes]:  # fmt: skip
    """Where `manifest` (the tree after `previous`, its `inline` contents given) is stored, and
    its stored bytes: against a base on `previous`'s chain (held by `previous`, else read by
    `base_of`), or whole where that chain names an object out of reach (`in_reach`). Sets the
    manifest's ref, chain and bases."""
    head: Head | None = None
    chain: Chain = ()
    known: dict[str, Manifest] = {}
    if previous is not None and previous._stored is not None:  # else nothing to be against
        below = chain_of(previous)
        position = below[0][0] + 1
        at = position & (position - 1)
        chain = tuple(link for link in below if link[0] <= at)
        if all(in_reach(ref.key, keys.tree_key(ref.sha256)) for _, ref in chain):
            known = {**bases_of(previous), below[0][1].key: previous}
            ref = chain[0][1]
            base = known.get(ref.key)
            if base is None:
                base = known[ref.key] = base_of(ref)
            head = _delta(manifest, base, position, ref)
    if head is None:
        head, chain = _whole(manifest), ()
    body = head.model_dump_json(exclude_defaults=True).encode()
    contents = (inline[digest] for digest, _ in manifest.inline)
    data = zlib.compress(b"".join([body, b"\n", *contents]), COMPRESSION_LEVEL)
    digest, folder = sha256(data), _folder.get()
    key = keys.snapshot_key(folder, digest) if folder else keys.tree_key(digest)
    ref = ObjectRef(key=key, size=len(data), sha256=digest)
    manifest._stored, manifest._chain = ref, ((head.position, ref), *chain)
    manifest._bases = {link.key: known[link.key] for _, link in chain if link.key in known}
    return ref, data


def in_reach(key: str, shared: str) -> bool:
    """Whether a snapshot committed now may name the object at `key` (`shared`: where its
    digest puts it among the shared trees and packs): one of those, or one of the folder of
    the episode it is committed for, never another episode's, which retention deletes when
    that episode ends. Before, a worker's cache took an identical snapshot of another episode
    for this one's, and the steps after it were stored against that episode's folder."""
    folder = _folder.get()
    return key == shared or (folder is not None and key.startswith(folder))


def bases_of(manifest: Manifest) -> dict[str, Manifest]:
    """The trees of `manifest`'s chain below it that it holds (key → tree)."""
    return manifest._bases if isinstance(manifest, Snapshot) else {}


def shared_entries(entries: list[Entry], previous: Manifest | None) -> list[Entry]:
    """`entries`, each that is as it was in `previous` replaced by `previous`'s (immutable):
    the trees a session holds (its snapshot and its bases) then share their unchanged
    entries, some 1 KB each decoded: a base costs tens of bytes an entry, not 1 KB."""
    if previous is None:
        return entries
    before = {entry.path: entry for entry in previous.entries}
    return [  # by their fields' values: pydantic's equality counts the fields given
        entry if (was := before.get(entry.path)) is None or vars(was) != vars(entry) else was
        for entry in entries
    ]


def _whole(manifest: Manifest) -> Head:
    packs: list[int | Held] = [Held(**pack.model_dump()) for pack in manifest.packs]
    return Head(
        version=2, entries=manifest.entries, mtimes=manifest.mtimes, packs=packs,
        inline=manifest.inline, check=manifest.check,
    )  # fmt: skip


def _delta(manifest: Manifest, base: Manifest, position: int, ref: ObjectRef) -> Head | None:
    """`manifest` as its changes since `base` (stored at `ref`), None if it is to be whole."""
    if bool(manifest.mtimes) != bool(base.mtimes):
        return None
    before, after = _state(base), _state(manifest)
    changed = [entry for entry in manifest.entries if before.get(entry.path) != after[entry.path]]
    removed = [path for path in before if path not in after]
    if 2 * (len(changed) + len(removed)) > len(manifest.entries):
        return None
    times = _times(manifest)
    places = {(pack.sha256, pack.key): n for n, pack in enumerate(base.all_packs())}
    packs: list[int | Held] = [
        places.get((pack.sha256, pack.key), Held(**pack.model_dump())) for pack in manifest.packs
    ]
    return Head(
        version=2, base=ref, position=position, entries=changed, removed=removed, packs=packs,
        mtimes=[times[entry.path] for entry in changed if entry.kind == "file"] if times else [],
        inline=manifest.inline, check=manifest.check,
    )  # fmt: skip


def _state(manifest: Manifest) -> dict[str, tuple[tuple[object, ...], int | None]]:
    """Path → what a change of it is told by: the entry's fields, and a file's time."""
    times = _times(manifest)
    return {entry.path: (_fields(entry), times.get(entry.path)) for entry in manifest.entries}


def _times(manifest: Manifest) -> dict[str, int]:
    """Each file's time (path → ns); none if the tree keeps none."""
    if not manifest.mtimes:
        return {}
    return dict(zip((entry.path for entry in manifest.files()), manifest.mtimes, strict=True))


def _fields(entry: Entry) -> tuple[object, ...]:
    """Compared rather than the entries (pydantic's equality may count the fields given)."""
    return (
        entry.kind, entry.sha256, entry.size, entry.executable, entry.target, entry.mode
    )  # fmt: skip


def head_of(stored: bytes) -> Head | None:
    """The head of a stored tree of format 2; None for format 1 (only its first bytes are
    decompressed)."""
    try:
        start = zlib.decompressobj().decompress(stored, len(FORMAT_2) + 1)
        if start[:-1] != FORMAT_2 or start[-1:] not in (b",", b"}"):
            return None
        line = zlib.decompress(stored).partition(b"\n")[0]
        return Head.model_validate_json(line)
    except (zlib.error, ValueError) as exc:
        raise TreeError(f"not a tree manifest: {str(exc).splitlines()[0]}") from None


def rebuild(root: Manifest | None, levels: list[tuple[ObjectRef, Head]]) -> Snapshot:
    """The tree of the last of `levels` (each stored against the one before it, the first
    whole or against `root`)."""
    state: dict[str, tuple[Entry, int | None]] = {}
    held: list[Pack] = []
    chain: Chain = ()
    if root is not None:
        times = _times(root)
        state = {entry.path: (entry, times.get(entry.path)) for entry in root.entries}
        held, chain = root.all_packs(), chain_of(root)
    for ref, head in levels:
        if (head.base is None) != (head.position == 0) or (
            head.base is not None
            and (
                not chain or head.base.sha256 != chain[0][1].sha256 or head.position <= chain[0][0]
            )
        ):
            raise TreeError(f"{ref.key}: its base is not the tree before it in its chain")
        if head.base is None:
            state, held, chain = {}, [], ()
        packs = _packs(ref, head, held)
        _apply(ref, head, state)
        chain = ((head.position, ref), *chain)
        held = packs + ([Held(sha256=ref.sha256, size=ref.size, contents=head.inline,
                              tree=True, at=ref.key)] if head.inline else [])  # fmt: skip
    top = levels[-1][1]
    listing = [state[name] for name in sorted(state)]
    timed = [time for entry, time in listing if entry.kind == "file"]
    if None in timed and any(time is not None for time in timed):
        raise TreeError(f"{levels[-1][0].key}: some files have times and some do not")
    try:
        manifest = Snapshot(
            entries=[entry for entry, _ in listing],
            mtimes=[] if None in timed else timed,
            packs=held[: len(top.packs)], inline=top.inline, check=top.check,
        )  # fmt: skip
    except ValidationError as exc:
        raise TreeError(f"{levels[-1][0].key}: {str(exc).splitlines()[-1]}") from None
    manifest._stored, manifest._chain = levels[-1][0], chain
    if root is not None:
        known = {**bases_of(root), chain_of(root)[0][1].key: root}
        manifest._bases = {ref.key: known[ref.key] for _, ref in chain[1:] if ref.key in known}
    return manifest


def _packs(ref: ObjectRef, head: Head, held: list[Pack]) -> list[Pack]:
    """The objects `head` names, each of the base's (`held`) by its place."""
    try:
        return [held[pack] if isinstance(pack, int) else pack for pack in head.packs]
    except IndexError:
        raise TreeError(f"{ref.key} names an object its base does not hold") from None


def _apply(ref: ObjectRef, head: Head, state: dict[str, tuple[Entry, int | None]]) -> None:
    """`state` (path → entry and time) with the changes of `head`."""
    files = [entry for entry in head.entries if entry.kind == "file"]
    if head.mtimes and len(head.mtimes) != len(files):
        raise TreeError(f"{ref.key}: {len(head.mtimes)} times for {len(files)} files")
    for path in head.removed:
        if state.pop(path, None) is None:
            raise TreeError(f"{ref.key} removes {path!r}, which its base does not hold")
    times = iter(head.mtimes)
    for entry in head.entries:
        time = next(times, None) if entry.kind == "file" else None
        state[entry.path] = (entry, time)
