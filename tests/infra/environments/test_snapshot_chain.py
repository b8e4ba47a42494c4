"""What a step's snapshot uploads, and what a restore gives: a step of a 1,000-file workspace
that changed one file uploads some hundreds of bytes, not the whole manifest (94 KB before);
a snapshot read back in a fresh process (its chain of earlier objects) is exactly the tree
committed, step after step of random changes, reading a bounded chain; and the snapshots of
older builds (the whole manifest in one object) restore, and grow, as before."""

from __future__ import annotations

import os
import random
import statistics
import time
from pathlib import Path

import pytest

from contracts.common import ObjectRef
from infra.environments.disk import restore
from infra.environments.snapshots import RACY_NS, MemoryObjects, Scanner, Trees, coarse_now
from infra.environments.tree import Manifest, manifest_ref, pack_files

FILES = 1000


class Counted(MemoryObjects):
    """Objects whose PUTs (bytes) and GETs are counted."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        super().__init__(objects)
        self.puts: list[int] = []
        self.gets = 0

    def put(self, key: str, data: bytes) -> None:
        self.puts.append(len(data))
        super().put(key, data)

    def get(self, key: str) -> bytes:
        self.gets += 1
        return super().get(key)


def settle(root: Path) -> None:
    """Wait until the clock is past the times of what is under `root` (scans trust them)."""
    newest = max((p.lstat().st_ctime_ns for p in root.rglob("*")), default=0)
    while coarse_now() <= newest + RACY_NS:
        time.sleep(0.001)


def started(
    tmp_path: Path, files: dict[str, str]
) -> tuple[Counted, Trees, Scanner, Path, Manifest]:
    """A session's start: the task's tree stored, restored into a workspace, primed."""
    initial = pack_files(files)
    objects = Counted(initial.objects)
    trees, scanner = Trees(objects), Scanner(256 << 20)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    manifest = trees.get_manifest(initial.ref)
    restore(manifest, trees.get_contents(manifest), workspace, None)
    scanner.prime(workspace, manifest)
    return objects, trees, scanner, workspace, manifest


def step(
    scanner: Scanner, trees: Trees, workspace: Path, manifest: Manifest
) -> tuple[ObjectRef, Manifest]:
    settle(workspace)
    entries, new = scanner.scan(workspace, manifest.packed(), prune=True)
    return trees.commit(entries, new, manifest, mtimes=scanner.mtimes)


def test_a_step_that_changed_one_file_of_1000_uploads_what_it_changed(tmp_path: Path) -> None:
    """Before, each step uploaded the whole manifest: 92-96 KB a step here."""
    files = {f"pkg{n // 50}/module_{n}.py": f"def f{n}(x):\n    return x + {n}\n" * 20 for n in range(FILES)}  # fmt: skip
    objects, trees, scanner, workspace, manifest = started(tmp_path, files)
    uploads = []
    for n in range(1, 41):
        (workspace / f"pkg{n % 20}" / f"module_{n}.py").write_text(f"changed at step {n}\n")
        before = len(objects.puts)
        ref, manifest = step(scanner, trees, workspace, manifest)
        assert len(objects.puts) == before + 1  # one PUT a step
        uploads.append(objects.puts[-1])
    whole = uploads[0]  # the first holds each file's restore time: stored whole
    later = uploads[1:]
    assert whole > 80_000 and max(later) < whole // 20, later
    assert statistics.median(later) < 600 and statistics.mean(later) < 1000, later


def test_a_snapshot_read_in_a_fresh_process_is_the_tree_committed(tmp_path: Path) -> None:
    """Random steps (files written, rewritten at the same size, removed, renamed, touched,
    made executable, linked, hard-linked; directories made and removed, some steps changing
    half the tree): after each, a fresh `Trees` reads the snapshot back to the very manifest
    (entries, times, the objects holding its contents) and restores the same tree, reading
    at most log2(steps) + 2 objects for its manifest."""
    rng = random.Random(7)
    files = {f"d{n % 7}/f{n}.txt": f"{n}\n" * rng.randint(1, 40) for n in range(120)}
    objects, trees, scanner, workspace, manifest = started(tmp_path, files)
    for n in range(1, 61):
        _change(workspace, rng, many=n % 17 == 0)
        ref, manifest = step(scanner, trees, workspace, manifest)
        fresh = Trees(objects)  # nothing cached
        objects.gets = 0
        read = fresh.get_manifest(ref)
        assert objects.gets <= n.bit_length() + 2
        assert [e.model_dump() for e in read.entries] == [e.model_dump() for e in manifest.entries]
        assert read.mtimes == manifest.mtimes and read.inline == manifest.inline
        assert [(p.key, p.contents) for p in read.all_packs()] == [
            (p.key, p.contents) for p in manifest.all_packs()
        ]
        out = tmp_path / f"restored{n}"
        out.mkdir()
        restore(read, fresh.get_contents(read), out, None)
        again = Scanner(256 << 20)
        entries, _ = again.scan(out, set())
        assert [e.model_dump() for e in entries] == [e.model_dump() for e in manifest.entries]
        assert [again.mtimes[e.path] for e in read.files()] == read.mtimes


def _change(root: Path, rng: random.Random, many: bool) -> None:
    """One step's changes, `many`: rewrite over half of the files."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
    if many:
        for path in files[: len(files) // 2 + 2]:
            path.write_text(f"rewritten {rng.random()}\n")
        return
    for _ in range(rng.randint(1, 3)):
        files = sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())
        path = rng.choice(files)
        match rng.randrange(9):
            case 0:
                (root / f"d{rng.randrange(9)}").mkdir(exist_ok=True)
                (root / f"d{rng.randrange(9)}").mkdir(exist_ok=True)
                new = root / f"d{rng.randrange(9)}" / f"new{rng.random()}.txt"
                if new.parent.is_dir():
                    new.write_text("new\n")
            case 1:
                path.write_text(path.read_text()[::-1])  # the same size
            case 2:
                path.unlink()
            case 3:
                path.rename(path.with_name(f"moved{rng.random()}.txt"))
            case 4:
                t = rng.randrange(1, 1 << 40) * 1000
                os.utime(path, ns=(t, t))
            case 5:
                path.chmod(0o755 if rng.random() < 0.5 else 0o600)
            case 6:
                link = path.with_name(f"link{rng.random()}")
                os.symlink(path.name, link)
            case 7:
                os.link(path, path.with_name(f"hard{rng.random()}.txt"))
            case _:
                for empty in root.glob("d*"):
                    if empty.is_dir() and not any(empty.iterdir()):
                        empty.rmdir()


def test_an_older_builds_snapshot_restores_and_a_step_grows_it(tmp_path: Path) -> None:
    """A run in flight during an upgrade: its last snapshot is of the older build (the whole
    manifest, with times, in one object). It restores as it did, and the next step after it
    uploads what changed."""
    files = {f"f{n}.txt": f"{n}\n" * 30 for n in range(300)}
    objects, trees, scanner, workspace, manifest = started(tmp_path, files)
    (workspace / "f1.txt").write_text("one\n")
    settle(workspace)
    entries, new = scanner.scan(workspace, manifest.packed(), prune=True)
    timed = Manifest(
        entries=entries,
        mtimes=[scanner.mtimes[e.path] for e in entries if e.kind == "file"],
        packs=manifest.all_packs(),
        inline=[(digest, len(data)) for digest, data in sorted(new.items())],
    )  # as the older build's commit stored it
    old_ref, data = manifest_ref(timed, new)
    objects.put(old_ref.key, data)
    older = Trees(MemoryObjects(objects)).get_manifest(old_ref)
    assert older.mtimes == timed.mtimes and older.digest() == timed.digest()
    (workspace / "f2.txt").write_text("two\n")
    ref, later = step(scanner, trees, workspace, older)
    assert objects.puts[-1] < len(data) // 10
    read = Trees(MemoryObjects(objects)).get_manifest(ref)
    assert read.digest() == later.digest() and read.mtimes == later.mtimes
    out = tmp_path / "out"
    out.mkdir()
    restore(read, Trees(MemoryObjects(objects)).get_contents(read), out, None)
    assert (out / "f1.txt").read_text() == "one\n" and (out / "f2.txt").read_text() == "two\n"


@pytest.mark.parametrize("removed", [1, 160])
def test_a_step_that_changed_half_the_tree_is_stored_whole(tmp_path: Path, removed: int) -> None:
    """A delta that names more than half the entries is no smaller than the tree: stored whole
    (no earlier object needed to read it), and the steps after it are stored against it."""
    files = {f"f{n:03d}.txt": f"{n}\n" * 30 for n in range(300)}
    objects, trees, scanner, workspace, manifest = started(tmp_path, files)
    (workspace / "f000.txt").write_text("first\n")
    ref, manifest = step(scanner, trees, workspace, manifest)
    (workspace / "f001.txt").write_text("second\n")
    ref, manifest = step(scanner, trees, workspace, manifest)
    for n in range(2, 2 + removed):
        (workspace / f"f{n:03d}.txt").unlink()
    ref, manifest = step(scanner, trees, workspace, manifest)
    fresh = Trees(objects)
    objects.gets = 0
    fresh.get_manifest(ref)
    assert objects.gets == (1 if removed > 150 else 2)  # whole, or against the first step's
