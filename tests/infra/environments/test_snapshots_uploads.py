"""What snapshots upload step after step: in proportion to what the steps changed, never the
task's initial tree or a large earlier change again because the tree spans `MAX_PACKS` objects;
and a restore still fetches at most `MAX_PACKS` objects holding at most twice the live bytes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from infra.environments.disk import restore
from infra.environments.snapshots import RACY_NS, MemoryObjects, Scanner, Trees, coarse_now
from infra.environments.tree import MAX_PACKS, Manifest, pack_files, tree_digest

FILES, FILE_BYTES = 300, 4096


def settle(root: Path) -> None:
    """Wait until the clock is past the times of what is under `root` (scans trust them)."""
    newest = max(p.stat().st_ctime_ns for p in root.rglob("*"))
    while coarse_now() <= newest + RACY_NS:
        time.sleep(0.001)


@pytest.mark.parametrize("large_step", [None, 1])
def test_each_step_uploads_what_it_changed(tmp_path: Path, large_step: int | None) -> None:
    """A 1.2 MB, 300-file task tree, then one small file changed a step (and at `large_step` a
    600 KB file added). Before, every `MAX_PACKS`th step uploaded the whole tree again."""
    initial = pack_files(
        {f"pkg{n // 50}/m{n}.py": os.urandom(FILE_BYTES) for n in range(FILES)}
    )  # incompressible: a stored byte is an uploaded one
    objects = MemoryObjects(initial.objects)
    trees, scanner = Trees(objects), Scanner(64 << 20)
    workspace, restored = tmp_path / "ws", tmp_path / "restored"
    workspace.mkdir()
    restored.mkdir()
    manifest = trees.get_manifest(initial.ref)
    restore(manifest, trees.get_contents(manifest), workspace, None)
    scanner.prime(workspace, manifest)
    large = os.urandom(600_000)
    uploads, steps = [], 3 * MAX_PACKS + 2
    for step in range(1, steps + 1):
        (workspace / f"pkg{step % 6}" / f"m{step}.py").write_text(f"changed at step {step}\n")
        if step == large_step:
            (workspace / "large.bin").write_bytes(large)
        settle(workspace)
        entries, new = scanner.scan(workspace, manifest.packed(), prune=True)
        ref, manifest = trees.commit(entries, new, manifest, mtimes=scanner.mtimes)
        uploads.append(ref.size - (len(large) if step == large_step else 0))
        assert len(manifest.all_packs()) <= MAX_PACKS
        held = sum(size for pack in manifest.all_packs() for _, size in pack.contents)
        assert held <= 2 * sum(e.size for e in manifest.files())
    assert max(uploads) < initial.ref.size // 10, [u // 1024 for u in uploads]  # KiB
    restore(manifest, Trees(objects).get_contents(manifest), restored, None)
    assert tree_digest(Scanner(64 << 20).scan(restored, set())[0]) == manifest.digest()


def test_a_tree_that_lost_half_its_bytes_is_packed_anew(tmp_path: Path) -> None:
    """Dead bytes still bound what a restore fetches: once the initial tree is more than half
    dead, a snapshot holds the live contents itself (an upload no larger than what died)."""
    initial = pack_files({f"f{n}": os.urandom(1000) for n in range(10)})
    trees = Trees(MemoryObjects(initial.objects))
    manifest: Manifest = trees.get_manifest(initial.ref)
    restore(manifest, trees.get_contents(manifest), tmp_path, None)
    scanner = Scanner(1 << 20)
    for removed, repacked in ((5, False), (6, True)):
        for n in range(removed):
            (tmp_path / f"f{n}").unlink(missing_ok=True)
        entries, new = scanner.scan(tmp_path, manifest.packed())
        _, manifest = trees.commit(entries, new, manifest)
        assert (manifest.packs == []) is repacked
