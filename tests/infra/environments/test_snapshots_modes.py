"""Modes and hard links in snapshots: a restore gives every file and directory the mode it had
and makes hard links again, the tree digest covers both, setuid and setgid bits are never kept,
and a tree stored before modes were kept restores as it did."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import pytest

from infra.environments.disk import restore
from infra.environments.snapshots import MemoryObjects, Scanner, Trees
from infra.environments.tree import (
    Entry,
    File,
    Manifest,
    decode_tree,
    manifest_ref,
    pack_files,
    sha256,
    tree_digest,
)
from tests.paths import REPO_ROOT

MODES = {  # path → mode: what an agent's chmod and mkdir -m leave
    "keep.txt": 0o600,
    "ro.txt": 0o444,
    "onlyu.sh": 0o700,
    "plain.txt": 0o644,
    "run.sh": 0o755,
    "none": 0o000,
    "private": 0o700,
    "sticky": 0o1777,
    "shut": 0o555,
    "shut/in.txt": 0o640,
    "a": 0o750,
    "a/x": 0o604,
}
DIRS = {"private", "sticky", "shut", "a"}
LINKS = {"hard": "keep.txt", "shut/hard": "keep.txt", "a-x": "a/x"}
"""Hard links (new path → existing path); "a-x" sorts before "a/x", which the walk meets first."""


def write_modes(root: Path) -> None:
    for path in MODES:
        if path in DIRS:
            (root / path).mkdir()
        else:
            (root / path).write_text(f"{path}\n")
    for path, existing in LINKS.items():
        os.link(root / existing, root / path)
    os.symlink("keep.txt", root / "rel")
    for path, mode in sorted(MODES.items(), reverse=True):  # deepest first: fill, then close
        os.chmod(root / path, mode)


def listing(root: Path) -> dict[str, tuple[str, int, str]]:
    """path → (kind, mode bits, what it is: a link's target, a file's first path by inode)."""
    seen: dict[str, tuple[str, int, str]] = {}
    firsts: dict[int, str] = {}
    for top, dirs, files in os.walk(root):
        for name in sorted([*dirs, *files]):
            path = os.path.relpath(os.path.join(top, name), root)
            info = os.lstat(os.path.join(top, name))
            if stat.S_ISLNK(info.st_mode):
                seen[path] = ("link", 0, os.readlink(os.path.join(top, name)))
            elif stat.S_ISDIR(info.st_mode):
                seen[path] = ("dir", stat.S_IMODE(info.st_mode), "")
            else:
                firsts[info.st_ino] = min(firsts.get(info.st_ino, path), path)
                seen[path] = ("file", stat.S_IMODE(info.st_mode), str(info.st_ino))
    return {
        path: (kind, mode, firsts[int(what)] if kind == "file" else what)
        for path, (kind, mode, what) in seen.items()
    }


def scan_and_restore(source: Path, copy: Path, uid: int | None) -> tuple[Manifest, Manifest]:
    trees = Trees(MemoryObjects())
    entries, new = Scanner(1 << 20).scan(source, set(), prune=True)
    ref, manifest = trees.commit(entries, new, None)
    fresh = Trees(trees.objects)
    stored = fresh.get_manifest(ref)
    restore(stored, fresh.get_contents(stored), copy, uid)
    return manifest, stored


def test_a_restore_gives_each_path_its_mode_and_makes_hard_links_again(tmp_path: Path) -> None:
    """Before, a restore wrote every file 0644 or 0755 and every directory 0755, and each hard
    link as a file of its own, under the same tree digest: a `chmod 600` the agent saw was gone
    in a session restored after a crash and in the verifier's copy."""
    source, copy = tmp_path / "source", tmp_path / "copy"
    source.mkdir()
    copy.mkdir()
    write_modes(source)
    uid = 65534 if os.geteuid() == 0 else None
    manifest, stored = scan_and_restore(source, copy, uid)
    assert listing(copy) == listing(source)
    assert listing(copy)["hard"] == ("file", 0o600, "hard")  # sorted first: "hard" < "keep.txt"
    assert listing(copy)["a/x"] == ("file", 0o604, "a-x")
    again, _ = Scanner(1 << 20).scan(copy, set())
    assert tree_digest(again) == manifest.digest() == stored.digest()
    if uid is not None:
        assert {(copy / p).lstat().st_uid for p in [*MODES, *LINKS]} == {uid}


def test_the_digest_covers_modes_and_hard_links(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    (tmp_path / "d").mkdir()
    scanner = Scanner(1 << 20)
    digests = [tree_digest(scanner.scan(tmp_path, set())[0])]
    for change in (
        lambda: (tmp_path / "f").chmod(0o600),
        lambda: (tmp_path / "d").chmod(0o700),
        lambda: os.link(tmp_path / "f", tmp_path / "g"),
    ):
        change()
        digests.append(tree_digest(scanner.scan(tmp_path, set())[0]))
    assert len(set(digests)) == 4


def test_ordinary_modes_leave_entries_and_digests_as_before() -> None:
    """0644 and 0755 files and 0755 directories are stored as they were (the digests of trees
    recorded in runs stay what they were)."""
    packed = pack_files({"a.py": "1", "bin/run.sh": File(b"x", executable=True)})
    assert packed.manifest.digest() == (
        "01fd40b70f7cd494598853d6484a29192691c32382bd71a050acef4c73d74144"
    )
    assert packed.ref.sha256 == "72a7aa450d9d54441b1e57ac01500d0c781669c5b242ffa883ef2e319617d9c9"
    with tempfile.TemporaryDirectory() as top:
        root = Path(top)
        restore(packed.manifest, {sha256(b"1"): b"1", sha256(b"x"): b"x"}, root, None)
        root.chmod(0o755)
        entries, _ = Scanner(1 << 20).scan(root, set())
    assert tree_digest(entries) == packed.manifest.digest()
    assert b"mode" not in zlib.decompress(packed.objects[packed.ref.key])


def test_setuid_and_setgid_bits_are_never_kept(tmp_path: Path) -> None:
    """A restore by a root worker of a tree that kept them would hand out a setuid file (the
    hidden tests' and the solution's trees are restored as root's). A pruning scan clears them
    in the live workspace too, so it is the workspace a restore gives; the sticky bit is kept."""
    (tmp_path / "s").write_text("x")
    (tmp_path / "s").chmod(0o6755)
    (tmp_path / "g").mkdir()
    (tmp_path / "g").chmod(0o3775)
    entries, _ = Scanner(1 << 20).scan(tmp_path, set())
    assert [(e.path, e.mode) for e in entries] == [("g", 0o1775), ("s", None)]
    assert stat.S_IMODE((tmp_path / "s").stat().st_mode) == 0o6755  # no prune: left as it is
    again, _ = Scanner(1 << 20).scan(tmp_path, set(), prune=True)
    assert again == entries
    assert stat.S_IMODE((tmp_path / "s").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "g").stat().st_mode) == 0o1775
    with pytest.raises(ValueError, match="mode"):
        Entry(path="s", kind="file", sha256="0" * 64, mode=0o4755)


def test_a_tree_stored_before_modes_were_kept_restores_as_it_did(tmp_path: Path) -> None:
    """Without modes: files 0644 or 0755 (executable), directories 0755, and a hard link stored
    as a file of its own is written as one (runs' recorded snapshots name such trees)."""
    digest = sha256(b"same\n")
    head = (
        '{"entries":[{"path":"d","kind":"dir"},'
        f'{{"path":"d/a","kind":"file","sha256":"{digest}","size":5}},'
        f'{{"path":"d/b","kind":"file","sha256":"{digest}","size":5}},'
        f'{{"path":"run","kind":"file","sha256":"{digest}","size":5,"executable":true}}],'
        f'"inline":[["{digest}",5]]}}'
    )
    manifest, contents = decode_tree(zlib.compress(head.encode() + b"\nsame\n"))
    restore(manifest, contents, tmp_path, None)
    assert listing(tmp_path) == {
        "d": ("dir", 0o755, ""),
        "d/a": ("file", 0o644, "d/a"),
        "d/b": ("file", 0o644, "d/b"),
        "run": ("file", 0o755, "run"),
    }


@pytest.mark.parametrize(
    ("entries", "error"),
    [
        ([("b", "a")], "hard link"),  # to no file
        ([("a", ""), ("b", "c"), ("c", "")], "hard link"),  # to a later path
        ([("a", ""), ("b", "a"), ("c", "b")], "hard link"),  # to a link of another
    ],
)
def test_a_hard_link_names_an_earlier_file_of_the_same_content(
    entries: list[tuple[str, str]], error: str
) -> None:
    digest = "0" * 64
    with pytest.raises(ValueError, match=error):
        Manifest(
            entries=[
                Entry(path=p, kind="file", sha256=digest, size=1, target=t) for p, t in entries
            ]
        )
    first = Entry(path="a", kind="file", sha256=digest, size=1)
    for other in (
        Entry(path="b", kind="file", sha256="1" * 64, size=1, target="a"),
        Entry(path="b", kind="file", sha256=digest, size=1, target="a", mode=0o600),
        Entry(path="b", kind="file", sha256=digest, size=1, target="a", executable=True),
    ):
        with pytest.raises(ValueError, match="hard link"):
            Manifest(entries=[first, other])
    with pytest.raises(ValueError, match="has a mode"):
        Manifest(entries=[first, Entry(path="l", kind="link", target="a", mode=0o600)])
    linked = Manifest(
        entries=[first, Entry(path="b", kind="file", sha256=digest, size=1, target="a")]
    )
    assert decode_tree(manifest_ref(linked)[1])[0] == linked


NOT_ROOT = """
import os, sys
from pathlib import Path
from infra.environments.disk import restore
from infra.environments.snapshots import MemoryObjects, Scanner, Trees
source, copy = Path(sys.argv[1]), Path(sys.argv[2])
trees = Trees(MemoryObjects())
entries, new = Scanner(1 << 20).scan(source, set())
_, manifest = trees.commit(entries, new, None)
restore(manifest, new, copy, None)
print(sorted(os.listdir(copy / "shut")), oct(os.stat(copy / "shut").st_mode & 0o777))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="switches to another uid")
def test_a_worker_that_is_not_root_restores_into_directories_it_then_closes() -> None:
    """A 0555 directory gets its mode after what it holds: a worker that is not root could not
    write into it otherwise."""
    with tempfile.TemporaryDirectory() as top:  # in /tmp: pytest's tmp_path is root's alone
        source, copy = Path(top) / "source", Path(top) / "copy"
        for path in (Path(top), source, copy):
            path.mkdir(exist_ok=True)
            os.chown(path, 65534, 65534)
        (source / "shut").mkdir()
        (source / "shut" / "in.txt").write_text("x")
        (source / "shut" / "link").symlink_to("in.txt")
        os.link(source / "shut" / "in.txt", source / "shut" / "twin")
        (source / "shut").chmod(0o555)
        done = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", NOT_ROOT, str(source), str(copy)],
            capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
        )  # fmt: skip
        (copy / "shut").chmod(0o755)  # for the cleanup
    assert done.stdout.splitlines() == ["['in.txt', 'link', 'twin'] 0o555"], done.stderr[-2000:]
