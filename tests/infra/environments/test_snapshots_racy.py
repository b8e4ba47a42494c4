"""Racily clean files: a same-size rewrite within one tick of the kernel's clock, which leaves a
file's (inode, size, times, mode) as the scan remembered them, is still snapshotted.

Linux before 6.13 (5.15, 6.1, 6.6) stamps file times from a clock that moves once a tick (1 to
10 ms); this machine's kernel stamps finer ones. `coarse_kernel` plays the former, frozen for
the test: every file time the scanner reads, and its clock, are one instant, so a restore (or a
scan) and a rewrite after it fall in one tick every run, not by chance."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from infra.environments import snapshot_scan
from infra.environments.disk import restore
from infra.environments.snapshots import MemoryObjects, Scanner, Trees
from infra.environments.tree import Manifest, tree_digest

TICK = time.time_ns()
"""The one instant a frozen coarse clock reads."""


class _TickStat:
    """A stat whose times are the frozen tick's."""

    st_mtime_ns = st_ctime_ns = TICK

    def __init__(self, real: os.stat_result) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class _CoarseOs:
    """`os`, as the scanner sees it on a kernel whose clock does not tick during the test."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def stat(*args: Any, **kwargs: Any) -> _TickStat:
        return _TickStat(os.stat(*args, **kwargs))


@pytest.fixture
def coarse_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshot_scan, "os", _CoarseOs())


def _content(trees: Trees, manifest: Manifest, path: str) -> bytes:
    entry = next(e for e in manifest.files() if e.path == path)
    return trees.get_contents(manifest)[entry.sha256]


def _coarse_scanner() -> Scanner:
    scanner = Scanner(1 << 20)
    scanner.clock = lambda: TICK  # the kernel's clock, frozen as its file times are
    return scanner


@pytest.mark.parametrize("waits", [False, True], ids=["small-tree", "prime-waits-in-vain"])
def test_a_rewrite_in_the_tick_of_a_restore_is_snapshotted(
    tmp_path: Path, coarse_kernel: None, monkeypatch: pytest.MonkeyPatch, waits: bool
) -> None:
    """A retried step on a moved session: restore, prime, then `write_file` ms later (a prime
    that waits for the frozen clock gives up after `SETTLE_NS`)."""
    if waits:
        monkeypatch.setattr(snapshot_scan, "REREAD_BYTES", -1, raising=False)
    source, workspace = tmp_path / "source", tmp_path / "workspace"
    source.mkdir()
    workspace.mkdir()
    (source / "lib.py").write_bytes(b"def f():\n    retrun 1\n")
    (source / "other.py").write_bytes(b"x = 1\n")
    trees, scanner = Trees(MemoryObjects()), _coarse_scanner()
    _, first = trees.commit(*Scanner(1 << 20).scan(source, set()), None)
    restore(first, trees.get_contents(first), workspace, uid=None)
    scanner.prime(workspace, first)
    (workspace / "lib.py").write_bytes(b"def f():\n    return 1\n")  # same size, same inode
    entries, new = scanner.scan(workspace, first.packed())
    assert tree_digest(entries) != first.digest()  # else the step stores no snapshot at all
    _, second = trees.commit(entries, new, first)
    assert _content(trees, second, "lib.py") == b"def f():\n    return 1\n"


def test_a_rewrite_in_the_tick_of_a_scan_is_snapshotted(
    tmp_path: Path, coarse_kernel: None
) -> None:
    """Two steps within one tick: the second's same-size edit is not hidden by the first scan."""
    (tmp_path / "lib.py").write_bytes(b"retrun\n")
    trees, scanner = Trees(MemoryObjects()), _coarse_scanner()
    _, first = trees.commit(*scanner.scan(tmp_path, set()), None)
    (tmp_path / "lib.py").write_bytes(b"return\n")
    entries, new = scanner.scan(tmp_path, first.packed())
    _, second = trees.commit(entries, new, first)
    assert _content(trees, second, "lib.py") == b"return\n"


def test_a_primed_tree_is_not_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path a restore keeps (this kernel's clock): for a tree too large to read again
    (here: any), `prime` waits for its files to be old enough, and the next scan opens none."""
    monkeypatch.setattr(snapshot_scan, "REREAD_BYTES", -1)
    source, workspace = tmp_path / "source", tmp_path / "workspace"
    source.mkdir()
    workspace.mkdir()
    for n in range(8):
        (source / f"f{n}.py").write_text(f"x = {n}\n")
    trees, scanner = Trees(MemoryObjects()), Scanner(1 << 20)
    _, manifest = trees.commit(*Scanner(1 << 20).scan(source, set()), None)
    restore(manifest, trees.get_contents(manifest), workspace, uid=None)
    scanner.prime(workspace, manifest)
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: str, flags: int, *args: Any, **kwargs: Any) -> int:
        opened.append(str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", counting_open)
    entries, new = scanner.scan(workspace, manifest.packed())
    assert tree_digest(entries) == manifest.digest() and new == {}
    assert [path for path in opened if path.endswith(".py")] == []


def _settle(path: Path) -> None:
    newest = max(path.stat().st_mtime_ns, path.stat().st_ctime_ns)
    while snapshot_scan.coarse_now() <= newest + snapshot_scan.RACY_NS:
        time.sleep(0.001)


def test_a_same_size_rewrite_of_a_settled_file_is_snapshotted(tmp_path: Path) -> None:
    """The stat key's times: an in-place edit of the same size (same inode) of a file the
    cache trusts is read again."""
    lib = tmp_path / "lib.py"
    lib.write_bytes(b"retrun\n")
    _settle(lib)
    trees, scanner = Trees(MemoryObjects()), Scanner(1 << 20)
    _, first = trees.commit(*scanner.scan(tmp_path, set()), None)
    ino = lib.stat().st_ino
    with open(lib, "r+b") as f:  # in place: same inode, same size, later mtime
        f.write(b"return\n")
    assert lib.stat().st_ino == ino
    _settle(lib)
    entries, new = scanner.scan(tmp_path, first.packed())
    _, second = trees.commit(entries, new, first)
    (entry,) = second.files()
    assert trees.get_contents(second)[entry.sha256] == b"return\n"
