"""Workspace trees: the snapshot format, content-addressed and incremental.

A tree (a workspace, or a task's hidden tests) is stored as

    workspaces/trees/<sha[:2]>/<sha>.json.z   the manifest: every path with its kind, its mode,
                                              its content's digest and (a file's) mtime, the
                                              earlier objects holding those contents, and
                                              after the JSON line the contents new in this
                                              tree (zlib-compressed, named by its sha256)
    workspaces/packs/<sha[:2]>/<sha>.z        file contents, concatenated and zlib-compressed
                                              (read, no longer written: trees stored before
                                              contents moved into the manifest's object)

A snapshot after a step uploads one object: the manifest, with the contents the step created
inline (none if it changed nothing); for the other files it names the earlier trees (or packs)
holding them. A tree spans at most `MAX_PACKS` objects, and they hold at most twice its live
bytes (`packing.py`: a snapshot takes the smallest into its own, or all). So a restore is a
few large GETs whatever the number of files, a step that changed one file uploads that file
(now and then with the small objects of the steps before it), and a snapshot is one PUT.
The manifest's `ObjectRef` is what payloads carry (`SessionRef.snapshot`, `WorkspaceSpec.files`).

The tree digest (`Manifest.digest`) is the sha256 of the entries alone (paths, kinds, modes,
contents, link targets, hard links; not the packs): equal digests mean equal workspaces,
whatever the file times, owners, packing, or the order files were written in.

Each path is an `Entry` (`tree_entry.py`: its kind, content, link target, and the mode bits a
tree keeps, never setuid or setgid); a hard link is an entry for each of its paths.

Each file's mtime (ns) is kept beside the entries, out of the digest, and a restore sets it, so
`make` (which compares times) behaves alike in the live workspace and in one restored from
its snapshot; before, a restore wrote every file at the current time, in path order, and
`foo.o` came out newer than the `foo.c` changed after it. What a tree keeps no time for (the
files of a task's tree, every directory and link, the root) restores at `FIXED_MTIME_NS`: one
state restores alike for a group's samples and a retried step (at the current time it did not).

    packed = pack_files({"lib.py": "def f(): ...\\n", "run.sh": File(b"...", executable=True)})
    packed.manifest.digest(), packed.ref, packed.objects     # key → bytes (one), to upload

A hidden-tests tree also says how it is checked (`Check`): Harbor's `test.sh`, or the built-in
suite's function tests run by the two-process verifier.

Not covered: file owners, a live workspace's times of directories and links, a file's other
times (atime is set to its mtime; ctime is the restore's), setuid and setgid bits, the mode of
the tree's root, special files (FIFOs, sockets, devices: never stored). Trees stored before
modes were kept restore as they did: files 0644 or 0755, directories 0755, hard links as
separate files.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from contracts.common import ObjectRef
from contracts.task import MAX_CHECK_S
from infra import keys
from infra.environments.tree_entry import Entry
from infra.environments.tree_entry import entry_mode as entry_mode

COMPRESSION_LEVEL = 1
"""zlib level of packs and manifests: text shrinks 3-4×, fast."""
MAX_PACKS = 8
"""Stored objects (packs, earlier trees, its own) one tree may span."""
FIXED_MTIME_NS = 1_577_836_800 * 10**9
"""2020-01-01T00:00:00Z (ns), what a restore gives what a tree keeps no time for: after 1980
(zip refuses earlier times), before any file a step writes (which `make` sees as newer)."""


class TreeError(ValueError):
    """A tree that cannot be stored or restored (bad manifest, missing pack, too large)."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_path(path: str) -> str:
    """`path` if it is a normalised relative path inside a tree, else TreeError."""
    if (
        not path
        or path.startswith("/")
        or "\0" in path
        or posixpath.normpath(path) != path
        or path == "."
        or path.split("/", 1)[0] == ".."
    ):
        raise TreeError(f"{path!r} is not a relative path inside the tree")
    return path


class Check(BaseModel):
    """How a hidden-tests tree scores a final workspace."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["script", "functions"]
    """`script`: Harbor's `test.sh`, run by its `#!` line (workspace at its workdir, this tree
    at /tests read-only, the reward in /logs/verifier/reward.txt or reward.json:
    `checks.check_script`); `functions`: `tests` run by the two-process verifier's checker
    against the functions of the workspace's `modules`."""
    tests: str = "test.sh"
    """The file of this tree that holds the tests."""
    modules: list[str] = []
    """`functions`: the workspace modules (dotted names) whose functions the tests call."""
    timeout_s: float | None = Field(default=None, gt=0, le=MAX_CHECK_S)
    """Wall time of the check, where the task states one (more or less than the run's limits:
    `script`'s deadline and CPU limit); None, the run's limits."""
    env: dict[str, str] = {}
    """`script`: variables of the test script (Harbor's `[verifier] env`)."""


class Pack(BaseModel):
    """One stored object holding contents, in order: a pack, or the inline contents of a tree."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """Digest of the stored (compressed) bytes; names the object."""
    size: int = Field(ge=0)
    """Stored bytes."""
    contents: list[tuple[str, int]]
    """(digest, size) of each content, in the order they are concatenated."""
    tree: bool = False
    """The object is a stored tree (its manifest's inline contents), not a pack."""

    @property
    def key(self) -> str:
        return keys.tree_key(self.sha256) if self.tree else keys.pack_key(self.sha256)

    def unpack(self, stored: bytes) -> dict[str, bytes]:
        """Digest → content of this object's stored bytes, each content checked."""
        if sha256(stored) != self.sha256:
            raise TreeError(f"{self.key} does not match its digest")
        try:
            data = zlib.decompress(stored)
        except zlib.error as exc:
            raise TreeError(f"{self.key} is not zlib data: {exc}") from None
        if self.tree:  # the contents follow the manifest's JSON line, which is not needed here
            data = data.partition(b"\n")[2]
        return _split(data, self.contents, self.key)


def _split(data: bytes, listing: list[tuple[str, int]], where: str) -> dict[str, bytes]:
    """Digest → content of the concatenated `data`, each checked against its digest."""
    contents, offset = {}, 0
    for digest, size in listing:
        content = data[offset : offset + size]
        if sha256(content) != digest:
            raise TreeError(f"{where} holds a corrupt content")
        contents[digest], offset = content, offset + size
    if offset != len(data):
        raise TreeError(f"{where} holds {len(data) - offset} bytes its listing does not name")
    return contents


def make_pack(contents: Mapping[str, bytes]) -> tuple[Pack, bytes]:
    """A pack of `contents` (digest → bytes) and its stored bytes: the earlier layout, which
    trees still read (nothing writes it but tests of that reading)."""
    order = sorted(contents)
    stored = zlib.compress(b"".join(contents[d] for d in order), COMPRESSION_LEVEL)
    listing = [(digest, len(contents[digest])) for digest in order]
    return Pack(sha256=sha256(stored), size=len(stored), contents=listing), stored


class Manifest(BaseModel):
    """A tree: its entries in path order, the packs holding their contents, and for hidden
    tests how they are checked."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    entries: list[Entry]
    mtimes: list[int] = []
    """Each file's modification time (ns), in the order of its file entries, which a restore
    sets; not part of the tree digest (empty: not kept, each file gets `FIXED_MTIME_NS`).
    Beside the entries, not in them: one field more makes each decoded entry 500 B larger
    (pydantic's set of the fields given outgrows its smallest table)."""
    packs: list[Pack] = []
    """Earlier stored objects holding some of its contents."""
    inline: list[tuple[str, int]] = []
    """(digest, size) of the contents stored in this manifest's own object, after its JSON."""
    check: Check | None = None
    _stored: ObjectRef | None = PrivateAttr(default=None)
    """Where it is stored, once it is (`manifest_ref`, `decode_tree`)."""
    _digest: str = PrivateAttr(default="")
    """`digest()`, once computed."""

    @model_validator(mode="after")
    def _well_formed(self) -> Manifest:
        """Sorted unique normalised paths; nothing below a link or a file (so restoring never
        writes through a link); files name a content, hard links an earlier file of theirs;
        modes only on files and directories, and a file's executable bit as its mode says."""
        previous, leaves = "", dict[str, Entry]()
        for entry in self.entries:
            path = check_path(entry.path)
            if path <= previous and previous:
                raise TreeError(f"entries are not in strict path order at {path!r}")
            parent = posixpath.dirname(path)
            while parent:
                if parent in leaves:
                    raise TreeError(f"{path!r} lies below the link or file {parent!r}")
                parent = posixpath.dirname(parent)
            if entry.kind == "file":
                _check_file(entry, leaves)
            elif entry.mode is not None and entry.kind == "link":
                raise TreeError(f"link {path!r} has a mode")
            if entry.kind != "dir":
                leaves[path] = entry
            previous = path
        if self.mtimes and len(self.mtimes) != len(self.files()):
            raise TreeError(f"{len(self.mtimes)} mtimes for {len(self.files())} files")
        return self

    def digest(self) -> str:
        """The tree digest: sha256 over the entries (not the packs or `check`); computed once."""
        if not self._digest:
            self._digest = tree_digest(self.entries)
        return self._digest

    def encode(self, inline: Mapping[str, bytes]) -> bytes:
        """The stored bytes: the JSON line, then the `inline` contents in listing order."""
        if set(inline) != {digest for digest, _ in self.inline}:
            raise TreeError("the inline contents given are not the ones the manifest lists")
        head = self.model_dump_json(exclude_defaults=True).encode()  # one line: JSON escapes \n
        body = b"".join([head, b"\n", *(inline[digest] for digest, _ in self.inline)])
        return zlib.compress(body, COMPRESSION_LEVEL)

    def files(self) -> list[Entry]:
        return [entry for entry in self.entries if entry.kind == "file"]

    def holds(self, entries: Sequence[Entry], mtimes: Mapping[str, int]) -> bool:
        """Whether `entries` with their files' `mtimes` (path → ns) are this tree, with the
        times a restore gives its files (a step that only touched a file changes what a
        restore makes, not the tree digest)."""
        if tree_digest(entries) != self.digest():
            return False
        return self.file_times() == [mtimes.get(e.path) for e in self.files()]

    def file_times(self) -> list[int]:
        """What a restore gives each file (ns, in order): its kept time, else `FIXED_MTIME_NS`."""
        return self.mtimes or [FIXED_MTIME_NS] * len(self.files())

    def contents(self) -> set[str]:
        """Digests of its files' contents."""
        return {entry.sha256 for entry in self.files()}

    def packed(self) -> set[str]:
        """Digests of the contents stored with it (inline or in earlier objects)."""
        return {digest for pack in self.all_packs() for digest, _ in pack.contents}

    def all_packs(self) -> list[Pack]:
        """The objects holding its contents: its packs, and its own object if it has inline
        contents (TreeError if it is not stored yet)."""
        if not self.inline:
            return list(self.packs)
        if self._stored is None:
            raise TreeError("the manifest's own object is not stored yet")
        own = Pack(
            sha256=self._stored.sha256, size=self._stored.size, contents=self.inline, tree=True
        )
        return [*self.packs, own]


def _check_file(entry: Entry, earlier: Mapping[str, Entry]) -> None:
    """TreeError unless the file `entry` names a content, has the executable bit its mode
    says, and, if it is a hard link, names an earlier path holding the same file."""
    path = entry.path
    if not entry.sha256:
        raise TreeError(f"file {path!r} names no content")
    if entry.mode is not None and entry.executable != bool(entry.mode & 0o111):
        raise TreeError(f"file {path!r}: its executable bit is not its mode's")
    if entry.target:
        first = earlier.get(entry.target)
        if (
            first is None
            or first.kind != "file"
            or first.target
            or _file_of(first) != _file_of(entry)
        ):
            raise TreeError(f"{path!r} is a hard link to no earlier file of its own content")


def _file_of(entry: Entry) -> tuple[str, int, bool, int | None]:
    """What the paths of one file (hard links) share."""
    return entry.sha256, entry.size, entry.executable, entry.mode


def decode_tree(stored: bytes) -> tuple[Manifest, dict[str, bytes]]:
    """A stored tree's manifest and its inline contents (digest → bytes, each checked)."""
    try:
        head, _, tail = zlib.decompress(stored).partition(b"\n")
        manifest = Manifest.model_validate_json(head)
    except (zlib.error, ValueError) as exc:
        raise TreeError(f"not a tree manifest: {str(exc).splitlines()[0]}") from None
    digest = sha256(stored)
    manifest._stored = ObjectRef(key=keys.tree_key(digest), size=len(stored), sha256=digest)
    return manifest, _split(tail, manifest.inline, f"tree {digest[:12]}…")


def tree_digest(entries: Sequence[Entry]) -> str:
    """sha256 over the entries of a tree, in path order."""
    listing = [
        entry.model_dump(exclude_defaults=True) for entry in sorted(entries, key=lambda e: e.path)
    ]
    return sha256(json.dumps(listing, sort_keys=True, separators=(",", ":")).encode())


def manifest_ref(
    manifest: Manifest, inline: Mapping[str, bytes] | None = None
) -> tuple[ObjectRef, bytes]:
    """Where `manifest` (with its `inline` contents) is stored, content-addressed, and its
    stored bytes."""
    data = manifest.encode(inline or {})
    digest = sha256(data)
    manifest._stored = ObjectRef(key=keys.tree_key(digest), size=len(data), sha256=digest)
    return manifest._stored, data


@dataclass(frozen=True)
class File:
    """A file of an in-memory tree."""

    data: bytes
    executable: bool = False


@dataclass(frozen=True)
class Packed:
    """An in-memory tree made storable: its manifest, its ref and every object to upload."""

    manifest: Manifest
    ref: ObjectRef
    objects: dict[str, bytes]
    """Object key → stored bytes (the manifest, its contents inline)."""


def pack_files(files: Mapping[str, File | bytes | str], check: Check | None = None) -> Packed:
    """An in-memory tree (path → content; parent directories are implied) as a `Packed`."""
    entries: dict[str, Entry] = {}
    contents: dict[str, bytes] = {}
    for path, content in files.items():
        file = content if isinstance(content, File) else File(_bytes(content))
        digest = sha256(file.data)
        contents[digest] = file.data
        check_path(path)
        entries[path] = Entry(
            path=path, kind="file", sha256=digest, size=len(file.data), executable=file.executable
        )
        parent = posixpath.dirname(path)
        while parent and parent not in entries:
            entries[parent] = Entry(path=parent, kind="dir")
            parent = posixpath.dirname(parent)
    listing = [entries[path] for path in sorted(entries)]
    inline = [(digest, len(contents[digest])) for digest in sorted(contents)]
    manifest = Manifest(entries=listing, inline=inline, check=check)
    ref, data = manifest_ref(manifest, contents)
    return Packed(manifest, ref, {ref.key: data})


def _bytes(content: bytes | str) -> bytes:
    return content.encode() if isinstance(content, str) else content
