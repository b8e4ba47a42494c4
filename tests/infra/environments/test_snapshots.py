"""Snapshots on disk and in the store: a scan and a restore round-trip a tree (equal digests),
a second scan reads only what changed and a commit stores only that, links and special files
are never followed, size limits hold, trees span few packs, and S3 holds them."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from contracts.common import ObjectRef
from infra.environments.disk import restore
from infra.environments.mounts import remove
from infra.environments.snapshots import (
    RACY_NS,
    MemoryObjects,
    Scanner,
    StoreObjects,
    Trees,
    coarse_now,
)
from infra.environments.tree import (
    MAX_PACKS,
    Entry,
    Manifest,
    TreeError,
    make_pack,
    manifest_ref,
    pack_files,
    sha256,
    tree_digest,
)
from infra.environments.walk import MAX_DEPTH
from infra.storage import ObjectStore
from tests.paths import REPO_ROOT


def write_tree(root: Path) -> None:
    (root / "src").mkdir()
    (root / "src" / "lib.py").write_text("def f():\n    return 1\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    (root / "empty").mkdir()
    (root / "data.bin").write_bytes(os.urandom(4096))
    os.symlink("/etc/shadow", root / "shadow")
    os.symlink("src/lib.py", root / "alias.py")
    os.mkfifo(root / "fifo")


def test_a_pruning_scan_removes_what_no_snapshot_keeps_and_names_it(tmp_path: Path) -> None:
    """A FIFO, names and a link target that are not UTF-8 (a directory with what it holds) are
    left out of every scan; a pruning scan also removes them, so the live tree is the tree a
    restore gives."""
    write_tree(tmp_path)
    os.mkdir(os.fsencode(tmp_path) + b"/d\xe9j\xe0")
    (Path(os.fsdecode(os.fsencode(tmp_path) + b"/d\xe9j\xe0")) / "inner.txt").write_text("x")
    os.symlink(b"caf\xe9", os.fsencode(tmp_path / "src") + b"/bad-link")
    kept = {"alias.py", "data.bin", "empty", "run.sh", "shadow", "src", "src/lib.py"}
    unkept = ["d\\xe9j\\xe0", "fifo", "src/bad-link"]
    scanner = Scanner(1 << 20)
    entries, _ = scanner.scan(tmp_path, set())
    assert {e.path for e in entries} == kept and scanner.unkept == unkept
    assert len(os.listdir(tmp_path)) == 8, "a scan that does not prune removed something"
    entries, _ = scanner.scan(tmp_path, set(), prune=True)
    assert {e.path for e in entries} == kept and scanner.unkept == unkept
    assert sorted(os.listdir(tmp_path)) == sorted(p for p in kept if "/" not in p)
    assert os.listdir(tmp_path / "src") == ["lib.py"]
    assert Scanner(1 << 20).scan(tmp_path, set(), prune=True)[0] == entries
    assert scanner.scan(tmp_path, set())[0] == entries and scanner.unkept == []


def test_scan_then_restore_round_trips_the_tree(tmp_path: Path) -> None:
    source, copy = tmp_path / "source", tmp_path / "copy"
    source.mkdir()
    copy.mkdir()
    write_tree(source)
    os.utime(source / "run.sh", ns=(1, 10**18 + 123))  # older than the files written after it
    trees, scanner = Trees(MemoryObjects()), Scanner(1 << 20)
    entries, new = scanner.scan(source, set())
    ref, manifest = trees.commit(entries, new, None, mtimes=scanner.mtimes)
    kinds = {e.path: e.kind for e in manifest.entries}
    assert kinds == {"alias.py": "link", "data.bin": "file", "empty": "dir", "run.sh": "file",
                     "shadow": "link", "src": "dir", "src/lib.py": "file"}  # fmt: skip
    assert next(e for e in manifest.entries if e.path == "shadow").target == "/etc/shadow"
    assert next(e for e in manifest.entries if e.path == "run.sh").executable
    fresh = Trees(trees.objects)  # another worker: nothing cached
    restored = fresh.get_manifest(ref)
    restore(restored, fresh.get_contents(restored), copy, uid=None)
    again, _ = Scanner(1 << 20).scan(copy, set())
    assert tree_digest(again) == manifest.digest() == restored.digest()
    assert os.readlink(copy / "shadow") == "/etc/shadow"
    assert os.access(copy / "run.sh", os.X_OK)
    files = [entry.path for entry in manifest.files()]  # their times, to the ns (`make`)
    assert [(copy / path).stat().st_mtime_ns for path in files] == [
        (source / path).stat().st_mtime_ns for path in files
    ]
    assert (copy / "run.sh").stat().st_mtime_ns == 10**18 + 123


def test_a_second_scan_reads_and_stores_only_what_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(20):
        (tmp_path / f"f{n}.txt").write_text(f"file {n}\n")
    objects = MemoryObjects()
    trees, scanner = Trees(objects), Scanner(1 << 20)
    newest = max(p.stat().st_ctime_ns for p in tmp_path.iterdir())
    while coarse_now() <= newest + RACY_NS:  # else a scan trusts no stat of them: re-reads all
        time.sleep(0.001)
    _, first = trees.commit(*scanner.scan(tmp_path, set()), None)
    (tmp_path / "f3.txt").write_text("changed\n")
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: str, flags: int, *args: object, **kwargs: object) -> int:
        opened.append(str(path))
        return real_open(path, flags, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", counting_open)
    entries, new = scanner.scan(tmp_path, first.packed())
    assert [path for path in opened if path.endswith(".txt")] == ["f3.txt"]
    assert list(new.values()) == [b"changed\n"]
    stored = len(objects)
    _, second = trees.commit(entries, new, first)
    assert len(objects) == stored + 1  # one object: the manifest with the changed file inline
    assert second.packs == first.all_packs() and second.inline == [(next(iter(new)), 8)]


def test_a_tree_spans_at_most_max_packs(tmp_path: Path) -> None:
    trees, scanner = Trees(MemoryObjects()), Scanner(1 << 20)
    for n in range(4):
        (tmp_path / f"f{n}.txt").write_text("x" * 100)
    _, manifest = trees.commit(*scanner.scan(tmp_path, set()), None)
    for step in range(3 * MAX_PACKS):
        (tmp_path / f"f{step % 4}.txt").write_text(f"step {step}" * 30)
        _, manifest = trees.commit(*scanner.scan(tmp_path, manifest.packed()), manifest)
        assert len(manifest.packs) <= MAX_PACKS
    dead = sum(size for p in manifest.all_packs() for _, size in p.contents)
    assert dead <= 2 * sum(e.size for e in manifest.files())


def test_limits_and_non_empty_targets_are_tree_errors(tmp_path: Path) -> None:
    (tmp_path / "big").write_bytes(b"x" * 2048)
    with pytest.raises(TreeError, match="more than"):
        Scanner(max_bytes=1024).scan(tmp_path, set())
    with pytest.raises(TreeError, match="paths"):
        Scanner(1 << 20, max_entries=0).scan(tmp_path, set())
    with pytest.raises(TreeError, match="not empty"):
        restore(pack_files({}).manifest, {}, tmp_path, uid=None)
    with pytest.raises(TreeError, match="no bytes"):
        Trees(MemoryObjects()).commit(Scanner(1 << 20).scan(tmp_path, set())[0], {}, None)


def test_a_tree_nested_too_deep_is_a_tree_error_and_removable(tmp_path: Path) -> None:
    """1,200 levels (one cheap command) broke the scan with RecursionError, a platform fault
    retried without end, and `rmtree` too (a workspace that could not be emptied)."""
    deep = tmp_path / "ws"
    subprocess.run(["mkdir", "-p", str(deep / ("d/" * 1200))], check=True)
    with pytest.raises(TreeError, match=f"deeper than {MAX_DEPTH} levels"):
        Scanner(1 << 20).scan(deep, set())
    remove(deep)
    assert not deep.exists()


NOT_ROOT = """
import os, sys
from pathlib import Path
from infra.environments.mounts import remove
from infra.environments.snapshots import Scanner
from infra.environments.tree import TreeError
ws = Path(sys.argv[1])
(ws / "f").write_text("x"); (ws / "f").chmod(0)
(ws / "d").mkdir(); (ws / "d" / "x").write_text("x"); (ws / "d").chmod(0o500)
try:
    Scanner(1 << 20).scan(ws, set())
except TreeError as exc:
    print(exc)
remove(ws)
print(ws.exists())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to another uid")
def test_what_a_worker_that_is_not_root_cannot_read_or_remove() -> None:
    """Without root, `chmod 000 f` made the scan raise PermissionError (retried without end)
    and `chmod 500 d` kept `rmtree(ignore_errors=True)` from emptying the workspace."""
    with tempfile.TemporaryDirectory() as top:  # in /tmp: pytest's tmp_path is root's alone
        ws = Path(top) / "ws"  # the worker's own sessions directory, and a session's in it
        ws.mkdir()
        for path in (Path(top), ws):
            os.chown(path, 65534, 65534)
        done = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", NOT_ROOT, str(ws)],
            capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
        )  # fmt: skip
    assert done.stdout.splitlines() == [
        "f: the worker may not read it (Permission denied)",
        "False",
    ], done.stderr[-2000:]


def test_trees_in_s3(store: ObjectStore) -> None:
    packed = pack_files({"a.txt": "same", "b/c.txt": "one"})
    for key, data in packed.objects.items():
        store.put_bytes(key, data)
    trees = Trees(StoreObjects(store))
    manifest = trees.get_manifest(packed.ref)
    assert trees.get_contents(manifest) == {
        e.sha256: d for e, d in zip(manifest.files(), (b"same", b"one"), strict=True)
    }
    changed = [
        *manifest.entries[:2],
        Entry(path="b/c.txt", kind="file", sha256=sha256(b"new"), size=3),
    ]
    ref, later = trees.commit(changed, {sha256(b"new"): b"new"}, manifest)
    assert later.packs == manifest.all_packs()  # "same" is not uploaded again
    store.delete(packed.ref.key)  # the tree `later` is stored against, and holds "same"
    with pytest.raises(TreeError, match=f"no tree at {packed.ref.key}"):
        Trees(StoreObjects(store)).get_contents(Trees(StoreObjects(store)).get_manifest(ref))
    with pytest.raises(TreeError, match="missing"):  # its contents' object, where it has a base
        Trees(StoreObjects(store)).get_contents(later)
    with pytest.raises(TreeError, match="no tree"):
        trees.get_manifest(ObjectRef(key="workspaces/trees/none", size=1, sha256="1" * 64))


def test_trees_of_the_earlier_layout_still_read_and_grow() -> None:
    """A tree stored before contents moved into the manifest's object (a pack beside it)."""
    old = pack_files({"a.txt": "kept", "b.txt": "old"}).manifest
    pack, stored = make_pack(
        {e.sha256: d for e, d in zip(old.files(), (b"kept", b"old"), strict=True)}
    )
    earlier = Manifest(entries=old.entries, packs=[pack])
    objects = MemoryObjects({pack.key: stored})
    ref, data = manifest_ref(earlier)
    objects[ref.key] = data
    trees = Trees(objects)
    manifest = trees.get_manifest(ref)
    assert set(trees.get_contents(manifest).values()) == {b"kept", b"old"}
    changed = [manifest.entries[0], Entry(path="b.txt", kind="file", sha256=sha256(b"new"), size=3)]
    _, later = trees.commit(changed, {sha256(b"new"): b"new"}, manifest)
    assert later.packs == [pack] and later.inline == [(sha256(b"new"), 3)]


def _commit_files(
    trees: Trees, root: Path, files: dict[str, int], previous: Manifest | None
) -> Manifest:
    """Commit a tree of exactly `files` (name → size, each file its own bytes) after `previous`."""
    for path in root.iterdir():
        path.unlink()
    for name, size in files.items():
        (root / name).write_bytes(name.encode().ljust(size, b"."))
    known = previous.packed() if previous else set()
    return trees.commit(*Scanner(1 << 20).scan(root, known), previous)[1]


@pytest.mark.parametrize(
    ("before", "after", "repacked"),
    [
        ({"x": 1000, "y": 1000}, {"x": 1000}, False),  # a pack half dead: 2 × live, kept
        ({"x": 1000, "y": 1001}, {"x": 1000}, True),  # one byte more: packed anew
        ({"x": 100, "y": 900}, {"x": 100, "z": 400}, True),  # the new bytes count too
        ({"x": 100, "y": 300}, {"x": 100, "z": 400}, False),
    ],
)
def test_a_tree_is_packed_anew_once_its_packs_hold_more_than_twice_its_live_bytes(
    tmp_path: Path, before: dict[str, int], after: dict[str, int], repacked: bool
) -> None:
    trees = Trees(MemoryObjects())
    first = _commit_files(trees, tmp_path, before, None)
    second = _commit_files(trees, tmp_path, after, first)
    live = {e.sha256 for e in second.files()}
    if repacked:
        assert second.packs == [] and {d for d, _ in second.inline} == live
    else:
        assert second.packs == first.all_packs() and {d for d, _ in second.inline} < live


def test_the_pack_count_restarts_when_it_reaches_max_packs(tmp_path: Path) -> None:
    """Each commit adds a file: the tree spans one more pack each time, until MAX_PACKS."""
    trees, manifest = Trees(MemoryObjects()), None
    files: dict[str, int] = {}
    counts = []
    for n in range(MAX_PACKS + 2):
        files[f"f{n}"] = 10
        manifest = _commit_files(trees, tmp_path, files, manifest)
        counts.append(len(manifest.packs))
    assert counts == [*range(MAX_PACKS), 0, 1]
