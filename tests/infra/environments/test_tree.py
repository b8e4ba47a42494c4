"""The tree format: manifests refuse what could write through a link, digests ignore what a
workspace's content does not depend on, stored trees round-trip."""

from __future__ import annotations

import zlib

import pytest
from pydantic import ValidationError

from infra import keys
from infra.environments.tree import (
    FIXED_MTIME_NS,
    Check,
    Entry,
    File,
    Manifest,
    TreeError,
    decode_tree,
    make_pack,
    manifest_ref,
    pack_files,
    sha256,
)

DIGEST = "0" * 64


def test_pack_files_is_content_addressed_and_round_trips() -> None:
    packed = pack_files({"pkg/mod.py": "x = 1\n", "run.sh": File(b"#!/bin/sh\n", executable=True)})
    assert [e.path for e in packed.manifest.entries] == ["pkg", "pkg/mod.py", "run.sh"]
    assert packed.ref.key == keys.tree_key(packed.ref.sha256)
    assert sha256(packed.objects[packed.ref.key]) == packed.ref.sha256
    assert list(packed.objects) == [packed.ref.key]  # one object: contents inline
    manifest, contents = decode_tree(packed.objects[packed.ref.key])
    assert manifest == packed.manifest and not manifest.packs
    assert contents[packed.manifest.entries[1].sha256] == b"x = 1\n" and len(contents) == 2
    [own] = manifest.all_packs()  # what a later tree names to reuse these contents
    assert own.key == packed.ref.key and own.unpack(packed.objects[own.key]) == contents
    assert (
        pack_files({"run.sh": File(b"#!/bin/sh\n", True), "pkg/mod.py": "x = 1\n"}).ref
        == packed.ref
    )


def test_the_digest_covers_contents_paths_and_modes_not_the_check() -> None:
    base = pack_files({"a.py": "1"}).manifest
    assert pack_files({"a.py": "1"}, Check(kind="script")).manifest.digest() == base.digest()
    for other in ({"a.py": "2"}, {"b.py": "1"}, {"a.py": File(b"1", executable=True)}):
        assert pack_files(other).manifest.digest() != base.digest()


def test_file_times_are_kept_beside_the_entries_out_of_the_digest() -> None:
    """A restore sets them (`disk.restore`); a tree stored before they were kept still reads,
    and a tree without them (a task's) is held by files at the time a restore gives them
    (`FIXED_MTIME_NS`) only: before, by any times, and a step that only touched a file of a
    task's tree was not stored."""
    untimed = pack_files({"a.c": "int a;", "b": "x", "d/e.o": "obj"})
    timed = Manifest(entries=untimed.manifest.entries, mtimes=[3, 1, 2])
    assert timed.digest() == untimed.manifest.digest()
    _, stored = manifest_ref(timed)
    assert decode_tree(stored)[0].mtimes == [3, 1, 2]
    assert b"mtimes" not in zlib.decompress(untimed.objects[untimed.ref.key])  # refs as before
    head = b'{"entries":[{"path":"a.py","kind":"file","sha256":"%s","size":1}]}' % DIGEST.encode()
    assert decode_tree(zlib.compress(head + b"\n"))[0].mtimes == []  # stored before: no times
    entries = timed.entries
    assert timed.holds(entries, {"a.c": 3, "b": 1, "d/e.o": 2})
    assert not timed.holds(entries, {"a.c": 3, "b": 1, "d/e.o": 4})  # touched: a new snapshot
    assert not untimed.manifest.holds(entries, {"a.c": 3, "b": 1, "d/e.o": 4})
    assert untimed.manifest.holds(entries, dict.fromkeys(["a.c", "b", "d/e.o"], FIXED_MTIME_NS))
    assert not untimed.manifest.holds(entries, {"a.c": FIXED_MTIME_NS, "b": FIXED_MTIME_NS})
    assert not timed.holds(entries[:-1], {"a.c": 3, "b": 1})
    with pytest.raises(ValidationError, match="2 mtimes for 3 files"):
        Manifest(entries=entries, mtimes=[1, 2])


@pytest.mark.parametrize(
    "entries",
    [
        [Entry(path="/etc/passwd", kind="file", sha256=DIGEST)],
        [Entry(path="../up", kind="file", sha256=DIGEST)],
        [Entry(path="a/../b", kind="file", sha256=DIGEST)],
        [
            Entry(path="link", kind="link", target="/etc"),
            Entry(path="link/passwd", kind="file", sha256=DIGEST),
        ],
        [Entry(path="f", kind="file", sha256=DIGEST), Entry(path="f/g", kind="dir")],
        [Entry(path="b", kind="dir"), Entry(path="a", kind="dir")],
        [Entry(path="a", kind="dir"), Entry(path="a", kind="dir")],
        [Entry(path="a", kind="file")],
    ],
    ids=[
        "absolute",
        "dotdot",
        "unnormalised",
        "below-a-link",
        "below-a-file",
        "unsorted",
        "duplicate",
        "no-blob",
    ],
)
def test_manifests_refuse_paths_that_could_escape_or_collide(entries: list[Entry]) -> None:
    with pytest.raises(ValidationError):
        Manifest(entries=entries)


def test_corrupt_objects_are_tree_errors() -> None:
    with pytest.raises(TreeError, match="not a tree manifest"):
        decode_tree(b"not zlib")
    packed = pack_files({"a.py": "content"})
    stored = packed.objects[packed.ref.key]
    forged = zlib.compress(zlib.decompress(stored).replace(b"\ncontent", b"\nforged!"))
    with pytest.raises(TreeError, match="corrupt"):
        decode_tree(forged)
    with pytest.raises(TreeError, match="holds 4 bytes its listing does not name"):
        decode_tree(zlib.compress(zlib.decompress(stored) + b"tail"))
    with pytest.raises(TreeError, match="not stored yet"):
        Manifest(entries=[], inline=[(DIGEST, 0)]).all_packs()
    # packs of the earlier layout (contents apart from the manifest) still read
    pack, stored = make_pack({sha256(b"content"): b"content"})
    with pytest.raises(TreeError, match="does not match"):
        pack.unpack(stored + b"x")
    forged, stored = make_pack({sha256(b"content"): b"forged!"})
    with pytest.raises(TreeError, match="corrupt"):
        forged.unpack(stored)
