"""Workspace trees: the snapshot format, content-addressed and incremental.

A tree (a workspace, or a task's hidden tests) is stored as

    workspaces/packs/<sha[:2]>/<sha>.z        file contents, concatenated and zlib-compressed,
                                              named by the sha256 of the stored bytes
    workspaces/trees/<sha[:2]>/<sha>.json.z   the manifest: every path with its kind, its
                                              executable bit and its content's digest, and the
                                              packs holding those contents (zlib-compressed
                                              JSON named by its own sha256)

A snapshot after a step uploads one pack with the contents the step created (none if it
changed nothing) and one manifest that still names earlier packs for the other files; once a
tree spans more than `MAX_PACKS` packs, or its packs hold more dead bytes than live ones, the
snapshot packs everything anew. So a restore is a few large GETs whatever the number of files,
and a step that changed one file uploads that file. The manifest's `ObjectRef` is what payloads
carry (`SessionRef.snapshot`, `WorkspaceSpec.files`).

The tree digest (`Manifest.digest`) is the sha256 of the entries alone (paths, kinds, the
executable bit, contents, link targets; not the packs): equal digests mean equal workspaces,
whatever the file times, owners, packing, or the order files were written in.

    packed = pack_files({"lib.py": "def f(): ...\\n", "run.sh": File(b"...", executable=True)})
    packed.manifest.digest(), packed.ref, packed.objects     # key → bytes, ready to upload

A hidden-tests tree also says how it is checked (`Check`): Harbor's `test.sh`, or the built-in
suite's function tests run by the two-process verifier.

Not covered: file owners, times and modes other than the executable bit, hard links (stored as
separate files), special files (FIFOs, sockets, devices: never stored).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from contracts.common import ObjectRef
from infra import keys

COMPRESSION_LEVEL = 1
"""zlib level of packs and manifests: text shrinks 3-4×, fast."""
MAX_PACKS = 8
"""Packs one tree may span before a snapshot packs it anew."""


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


class Entry(BaseModel):
    """One path of a tree."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    kind: Literal["file", "dir", "link"]
    sha256: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")
    """A file's content digest."""
    size: int = Field(default=0, ge=0)
    executable: bool = False
    target: str = ""
    """A link's target, as written (never followed when the tree is stored or restored)."""


class Check(BaseModel):
    """How a hidden-tests tree scores a final workspace."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["script", "functions"]
    """`script`: Harbor's `test.sh` (workspace at its workdir, this tree at /tests read-only,
    the reward in /logs/verifier/reward.txt); `functions`: `tests` run by the two-process
    verifier's checker against the functions of the workspace's `modules`."""
    tests: str = "test.sh"
    """The file of this tree that holds the tests."""
    modules: list[str] = []
    """`functions`: the workspace modules (dotted names) whose functions the tests call."""
    timeout_s: float | None = Field(default=None, gt=0, le=3600)
    """Wall time of the check, when the task asks for more than the run's limits."""
    env: dict[str, str] = {}
    """`script`: variables of the test script (Harbor's `[verifier] env`)."""


class Pack(BaseModel):
    """One stored pack: the contents it holds, in order."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """Digest of the stored (compressed) bytes; names the object."""
    size: int = Field(ge=0)
    """Stored bytes."""
    contents: list[tuple[str, int]]
    """(digest, size) of each content, in the order they are concatenated."""

    @property
    def key(self) -> str:
        return keys.pack_key(self.sha256)

    def unpack(self, stored: bytes) -> dict[str, bytes]:
        """Digest → content of this pack's stored bytes, each content checked."""
        if sha256(stored) != self.sha256:
            raise TreeError(f"pack {self.sha256[:12]}… does not match its digest")
        try:
            data = zlib.decompress(stored)
        except zlib.error as exc:
            raise TreeError(f"pack {self.sha256[:12]}… is not zlib data: {exc}") from None
        contents, offset = {}, 0
        for digest, size in self.contents:
            content = data[offset : offset + size]
            if sha256(content) != digest:
                raise TreeError(f"pack {self.sha256[:12]}… holds a corrupt content")
            contents[digest], offset = content, offset + size
        return contents


def make_pack(contents: Mapping[str, bytes]) -> tuple[Pack, bytes]:
    """A pack of `contents` (digest → bytes) and its stored bytes."""
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
    packs: list[Pack] = []
    check: Check | None = None

    @model_validator(mode="after")
    def _well_formed(self) -> Manifest:
        """Sorted unique normalised paths; nothing below a link or a file (so restoring never
        writes through a link); files name a content."""
        previous, leaves = "", set[str]()
        for entry in self.entries:
            path = check_path(entry.path)
            if path <= previous and previous:
                raise TreeError(f"entries are not in strict path order at {path!r}")
            parent = posixpath.dirname(path)
            while parent:
                if parent in leaves:
                    raise TreeError(f"{path!r} lies below the link or file {parent!r}")
                parent = posixpath.dirname(parent)
            if entry.kind == "file" and not entry.sha256:
                raise TreeError(f"file {path!r} names no content")
            if entry.kind != "dir":
                leaves.add(path)
            previous = path
        return self

    def digest(self) -> str:
        """The tree digest: sha256 over the entries (not the packs or `check`)."""
        return tree_digest(self.entries)

    def encode(self) -> bytes:
        data = self.model_dump_json(exclude_defaults=True).encode()
        return zlib.compress(data, COMPRESSION_LEVEL)

    @classmethod
    def decode(cls, data: bytes) -> Manifest:
        try:
            return cls.model_validate_json(zlib.decompress(data))
        except (zlib.error, ValueError) as exc:
            raise TreeError(f"not a tree manifest: {str(exc).splitlines()[0]}") from None

    def files(self) -> list[Entry]:
        return [entry for entry in self.entries if entry.kind == "file"]

    def contents(self) -> set[str]:
        """Digests of its files' contents."""
        return {entry.sha256 for entry in self.files()}

    def packed(self) -> set[str]:
        """Digests of the contents its packs hold."""
        return {digest for pack in self.packs for digest, _ in pack.contents}


def tree_digest(entries: Sequence[Entry]) -> str:
    """sha256 over the entries of a tree, in path order."""
    listing = [
        entry.model_dump(exclude_defaults=True) for entry in sorted(entries, key=lambda e: e.path)
    ]
    return sha256(json.dumps(listing, sort_keys=True, separators=(",", ":")).encode())


def manifest_ref(manifest: Manifest) -> tuple[ObjectRef, bytes]:
    """Where `manifest` is stored (content-addressed) and its stored bytes."""
    data = manifest.encode()
    digest = sha256(data)
    return ObjectRef(key=keys.tree_key(digest), size=len(data), sha256=digest), data


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
    """Object key → stored bytes (the manifest and its pack)."""


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
    objects: dict[str, bytes] = {}
    packs = []
    if contents:
        pack, stored = make_pack(contents)
        packs, objects[pack.key] = [pack], stored
    listing = [entries[path] for path in sorted(entries)]
    manifest = Manifest(entries=listing, packs=packs, check=check)
    ref, data = manifest_ref(manifest)
    objects[ref.key] = data
    return Packed(manifest, ref, objects)


def _bytes(content: bytes | str) -> bytes:
    return content.encode() if isinstance(content, str) else content
