"""Trees on disk: a scan counts what a restore will take of a workspace's tmpfs (a hard link:
no page), a tree whose paths pass PATH_MAX restores, primes and is handed to its uid, and what a
tree keeps no time for restores at one fixed time."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from infra.environments.disk import PAGE, Parents, disk_bytes, link_bytes, restore
from infra.environments.mounts import mount_tmpfs, remove_tree
from infra.environments.snapshots import MemoryObjects, Scanner, Trees
from infra.environments.tree import (
    FIXED_MTIME_NS,
    Entry,
    Manifest,
    TreeError,
    sha256,
    tree_digest,
)
from tests.infra.environments.conftest import needs_root

LONG = "n" * 250
"""One name of 250 bytes: 20 nested make a path of 5,019 bytes, past PATH_MAX (4,096)."""


def test_costs_are_whole_pages() -> None:
    assert [disk_bytes(size) for size in (0, 1, PAGE, PAGE + 1)] == [0, PAGE, PAGE, 2 * PAGE]
    assert link_bytes("x" * 126) == 0 and link_bytes("x" * 127) == PAGE


def test_a_scan_counts_a_hard_link_as_the_link_a_restore_makes(tmp_path: Path) -> None:
    """1,000 links to a one-byte file take one page: a restore links them again. Before, a
    restore wrote each as a file of its own (1,000 pages), which the scan counted."""
    (tmp_path / "one").write_text("x")
    (tmp_path / "d").mkdir()
    for n in range(1000):
        os.link(tmp_path / "one", tmp_path / "d" / str(n))
    entries, _ = Scanner(max_bytes=PAGE).scan(tmp_path, set())
    assert len(entries) == 1002
    assert {e.target for e in entries if e.kind == "file"} == {"", "d/0"}  # the first path
    with pytest.raises(TreeError, match=r"more than 0 MB \(each file counted in whole"):
        Scanner(max_bytes=PAGE - 1).scan(tmp_path, set())


@needs_root
def test_what_a_scan_accepts_fits_a_tmpfs_of_its_quota() -> None:
    top = Path(tempfile.mkdtemp(prefix="tempered-test-disk-"))
    try:
        source, copy = top / "source", top / "copy"
        for directory in (source, copy):
            directory.mkdir()
        (source / "one").write_text("x")
        for n in range(200):
            os.link(source / "one", source / f"h{n}")
            os.symlink("t" * 200, source / f"l{n}")  # a long target takes a page too
        quota = 201 * PAGE  # exactly: "one" (its 200 links take none), 200 long links
        entries, new = Scanner(quota).scan(source, set())
        _, manifest = Trees(MemoryObjects()).commit(entries, new, None)
        mount_tmpfs(copy, quota, 1000, os.geteuid())
        restore(manifest, new, copy, uid=None)  # no ENOSPC
        assert (copy / "one").stat().st_nlink == 201
        os.symlink("t" * 200, source / "l200")
        with pytest.raises(TreeError, match="more than"):
            Scanner(quota).scan(source, set())
    finally:
        remove_tree(top)


def _deep(root: Path, levels: int) -> int:
    """Make `levels` nested LONG directories under `root`; the deepest, open."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(levels):
        os.mkdir(LONG, dir_fd=fd)
        child = os.open(LONG, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    return fd


def test_a_tree_whose_paths_pass_path_max_restores(tmp_path: Path) -> None:
    """`for i in $(seq 20); do mkdir n…n && cd n…n; done` in one step: the scan (relative to
    each parent's descriptor) stored the path, but a restore by the whole path raised
    ENAMETOOLONG, a platform fault retried for ever."""
    source, copy = tmp_path / "source", tmp_path / "copy"
    source.mkdir()
    copy.mkdir()
    fd = _deep(source, 20)
    try:
        with os.fdopen(os.open("f.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd), "w") as f:
            f.write("deep\n")
        os.symlink("f.txt", "alias", dir_fd=fd)
    finally:
        os.close(fd)
    (source / "top.txt").write_text("top\n")
    scanner = Scanner(1 << 20)
    entries, new = scanner.scan(source, set())
    deepest = max(entries, key=lambda e: len(e.path))
    assert len(deepest.path.encode()) > 4096
    _, manifest = Trees(MemoryObjects()).commit(entries, new, None)
    uid = 65534 if os.geteuid() == 0 else None
    restore(manifest, new, copy, uid)
    scanner.prime(copy, manifest)
    again, unread = scanner.scan(copy, set(manifest.contents()))
    assert tree_digest(again) == manifest.digest() and unread == {}  # primed: nothing read
    with Parents(copy) as parents:
        parent_fd, name = parents.of(deepest.path)
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    assert uid is None or (info.st_uid, info.st_gid) == (uid, uid)


def test_what_a_tree_keeps_no_time_for_restores_at_one_fixed_time(tmp_path: Path) -> None:
    """A task's tree keeps no times, nor does any tree for its directories, links and root:
    each restore stamped them with the current time, so the samples of a group, and a retried
    step, saw other times in `ls -l` for one state. Files a tree keeps times for keep them."""
    one, two = b"1\n", b"2\n"
    entries = [
        Entry(path="a.py", kind="file", sha256=sha256(one), size=len(one)),
        Entry(path="d", kind="dir", mode=0o555),  # listed, read-only; d/e is only implied
        Entry(path="d/e/f.txt", kind="file", sha256=sha256(two), size=len(two)),
        Entry(path="link", kind="link", target="a.py"),
    ]
    contents = {sha256(one): one, sha256(two): two}
    paths = ["", "a.py", "d", "d/e", "d/e/f.txt", "link"]
    untimed, timed = Manifest(entries=entries), Manifest(entries=entries, mtimes=[7, 9])
    for n, manifest in enumerate((untimed, timed)):
        root = tmp_path / str(n)
        root.mkdir()
        restore(manifest, contents, root, uid=None)
        times = {path: os.lstat(root / path).st_mtime_ns for path in paths}
        expected = dict.fromkeys(paths, FIXED_MTIME_NS)
        if manifest.mtimes:
            expected.update({"a.py": 7, "d/e/f.txt": 9})
        assert times == expected, n
        assert (root / "d").stat().st_mode & 0o777 == 0o555
