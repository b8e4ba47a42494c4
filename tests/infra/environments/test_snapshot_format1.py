"""Snapshots of format 1 (`sandbox.workspaces.snapshot_format = 1`), for a fleet upgrading from
a build before format 2: what this build writes then is what the build before it wrote, byte
for byte, and that build's reader (its own `snapshots.py` and `tree.py`, in format1/) restores
it; even a step after a snapshot of format 2 in an episode's folder, whose contents such a
build could not find. Real SeaweedFS.

Before, every snapshot was of format 2, which such a build cannot read ("not a tree
manifest"), and its sandbox worker fails the task (a TreeError is not retried).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from pydantic import ValidationError

from contracts.common import ObjectRef
from infra import keys
from infra.environments.snapshot_chain import episode_folder, head_of
from infra.environments.snapshots import StoreObjects, Trees
from infra.environments.tree import Entry, Manifest, pack_files, sha256
from infra.settings import Settings
from infra.storage import ObjectStore

FORMAT_1 = Path(__file__).parent / "format1"
"""The earlier build's `tree.py` and `snapshots.py` (frozen: its README)."""


def source(name: str) -> str:
    return (FORMAT_1 / name).read_text()


@pytest.fixture
def older(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The earlier build's `snapshots.py`, over its own `tree.py` (scratch modules)."""
    (tmp_path / "older_tree.py").write_text(source("tree.py"))
    snapshots = source("snapshots.py")
    old_import = "from infra.environments.tree import"
    assert old_import in snapshots
    (tmp_path / "older_snapshots.py").write_text(
        snapshots.replace(old_import, "from older_tree import")
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("older_tree", "older_snapshots"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    module = importlib.import_module("older_snapshots")
    monkeypatch.setitem(sys.modules, "older_snapshots", module)
    return module


def read_by(older: ModuleType, store: ObjectStore, ref: ObjectRef) -> tuple[Any, dict[str, str]]:
    """The manifest and files the earlier build's worker restores from `ref`."""
    trees = older.Trees(older.StoreObjects(store))
    manifest = trees.get_manifest(ref)
    contents = trees.get_contents(manifest)
    return manifest, {e.path: contents[e.sha256].decode() for e in manifest.files()}


class Session:
    """One episode's workspace in memory, committed by a worker as a session would."""

    def __init__(self, trees: Any, manifest: Any, files: dict[str, str]) -> None:
        self.trees, self.manifest, self.files = trees, manifest, dict(files)
        self.times = {path: 1_000 for path in files}

    def step(self, n: int, entry: type[Any] = Entry) -> ObjectRef:
        self.files[f"f{n % 7}.py"], self.times[f"f{n % 7}.py"] = f"step {n}\n" * 40, 1_000 + n
        if n % 3 == 0:
            self.files.pop(f"f{n % 5 + 20}.py", None)
        entries = [entry(**e.model_dump()) for e in pack_files(self.files).manifest.entries]
        new = {sha256(text.encode()): text.encode() for text in self.files.values()}
        times = {path: self.times.get(path, 1_000) for path in self.files}
        ref, self.manifest = self.trees.commit(entries, new, self.manifest, mtimes=times)
        return ref  # type: ignore[no-any-return]


def test_format_1_is_what_the_earlier_build_wrote_and_it_reads(
    store: ObjectStore, older: ModuleType
) -> None:
    """Step after step, this build's commit and the earlier build's, from the same trees,
    store the same bytes at the same key (among the shared trees, as before), and the earlier
    build restores each."""
    files = {f"f{n}.py": f"{n}\n" * 30 for n in range(40)}
    task = pack_files(files)
    for key, data in task.objects.items():
        store.put_bytes(key, data)
    new = Trees(StoreObjects(store), snapshot_format=1)
    old = older.Trees(older.StoreObjects(store))
    ours = Session(new, new.get_manifest(task.ref), files)
    theirs = Session(old, old.get_manifest(task.ref), files)
    with episode_folder("run1", "t", 0):
        for n in range(1, 25):
            ref = ours.step(n)
            assert theirs.step(n, older.Entry) == ref and ref.key == keys.tree_key(ref.sha256)
            assert head_of(store.get_bytes(ref.key)) is None  # format 1
            manifest, restored = read_by(older, store, ref)
            assert restored == ours.files and manifest.mtimes == ours.manifest.mtimes


def test_a_format_1_step_after_a_format_2_snapshot_takes_its_contents_in(
    store: ObjectStore, older: ModuleType
) -> None:
    """A session whose last snapshot is of format 2 (in its episode's folder), continued by a
    worker set to format 1 (the setting lowered during an upgrade): the earlier build
    restores what that worker stores, and the episode's folder is not needed for it."""
    files = {f"f{n}.py": f"{n}\n" * 30 for n in range(40)}
    task = pack_files(files)
    for key, data in task.objects.items():
        store.put_bytes(key, data)
    newer = Trees(StoreObjects(store))
    session = Session(newer, newer.get_manifest(task.ref), files)
    with episode_folder("run1", "t", 0):
        for n in range(1, 6):
            session.step(n)
        assert session.manifest._stored is not None
        assert session.manifest._stored.key.startswith("runs/run1/snapshots/")
        session.trees = Trees(StoreObjects(store), snapshot_format=1)
        ref = session.step(6)
    store.delete_keys(list(store.list_keys(keys.episode_snapshots_prefix("run1", "t", 0))))
    manifest, restored = read_by(older, store, ref)
    assert restored == session.files and manifest.mtimes == session.manifest.mtimes
    assert isinstance(session.manifest, Manifest) and ref.key == keys.tree_key(ref.sha256)


def test_the_setting_writes_format_2_unless_lowered() -> None:
    assert Settings().sandbox.workspaces.snapshot_format == 2
    assert Settings(sandbox={"workspaces": {"snapshot_format": 1}}).sandbox.workspaces.snapshot_format == 1  # fmt: skip
    with pytest.raises(ValidationError, match="snapshot_format"):
        Settings(sandbox={"workspaces": {"snapshot_format": 3}})
