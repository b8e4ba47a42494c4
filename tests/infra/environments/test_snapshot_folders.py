"""An episode's snapshots in its own folder of the store (real SeaweedFS): where a step names its
episode, every object its snapshots write lies under `runs/<run>/snapshots/<task>--s<n>/`, and a
fresh worker restores each from there; a worker that died after its upload, a retry that
stored another tree against the same base, or an upload that failed never leave a ref that
restores a tree other than the one committed; a missing base is an error, never a wrong tree."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from contracts.common import ObjectRef
from contracts.episode import ToolCall
from contracts.task import SandboxLimits
from infra import keys
from infra.environments.snapshot_chain import episode_folder, head_of
from infra.environments.snapshots import Objects, StoreObjects, Trees
from infra.environments.tree import Entry, Manifest, TreeError, pack_files, sha256
from infra.storage import ObjectStore
from tests.infra.environments.conftest import Rig, needs_root

TIME = 1_700_000_000_000_000_000


class Episode:
    """A workspace's files in memory, committed step after step as a session would: on a
    worker of its own (`Trees`), from the snapshot `ref`."""

    def __init__(
        self, objects: Objects, ref: ObjectRef, files: dict[str, str],
        times: dict[str, int] | None = None, clock: int = TIME,
    ) -> None:  # fmt: skip
        self.objects, self.trees = objects, Trees(objects)
        self.ref, self.manifest = ref, self.trees.get_manifest(ref)
        self.files, self.times, self.clock = dict(files), dict(times or {}), clock

    @classmethod
    def started(cls, objects: Objects, initial: dict[str, str]) -> Episode:
        """An episode from the task's tree `initial` (stored first)."""
        packed = pack_files(initial)
        for key, data in packed.objects.items():
            objects.put(key, data)
        return cls(objects, packed.ref, initial)

    def elsewhere(self) -> Episode:
        """The episode restored from its last snapshot on another worker."""
        return Episode(self.objects, self.ref, self.files, self.times, self.clock + 5)

    def step(self, **changes: str | None) -> tuple[ObjectRef, Manifest]:
        """Write (or with None remove) files, each written at a new time, then commit."""
        self.clock += 1_000_000
        for path, text in changes.items():
            if text is None:
                del self.files[path]
            else:
                self.files[path], self.times[path] = text, self.clock
        entries: list[Entry] = pack_files(self.files).manifest.entries
        self.times = {e.path: self.times.get(e.path, TIME) for e in entries if e.kind == "file"}
        new = {sha256(text.encode()): text.encode() for text in self.files.values()}
        self.ref, self.manifest = self.trees.commit(entries, new, self.manifest, mtimes=self.times)
        return self.ref, self.manifest


def restored(store: ObjectStore, ref: ObjectRef) -> dict[str, str]:
    """The files a fresh worker restores from `ref`."""
    trees = Trees(StoreObjects(store))
    manifest = trees.get_manifest(ref)
    contents = trees.get_contents(manifest)
    return {e.path: contents[e.sha256].decode() for e in manifest.files()}


@pytest.fixture
def folder() -> Iterator[None]:
    with episode_folder("run1", "fix-bug", 3):
        yield


def test_an_episodes_snapshots_lie_in_its_folder_and_restore(store: ObjectStore) -> None:
    episode = Episode.started(StoreObjects(store), {f"f{n}.py": f"{n}\n" for n in range(40)})
    initial = episode.ref
    kept: list[tuple[ObjectRef, dict[str, str]]] = []
    with episode_folder("run1", "fix-bug", 3):
        for n in range(12):
            ref, _ = episode.step(**{f"f{n}.py": f"step {n}\n", f"new{n}.py": "x\n"})
            kept.append((ref, dict(episode.files)))
    prefix = keys.episode_snapshots_prefix("run1", "fix-bug", 3)
    assert prefix == "runs/run1/snapshots/fix-bug--s3/"
    written = set(store.list_keys(prefix))
    assert {ref.key for ref, _ in kept} == written and len(written) == 12
    held = {pack.key for pack in episode.manifest.all_packs()}  # the folder's, by their keys
    assert held & written and held <= written | {initial.key}
    for ref, files in kept:  # each step's snapshot, by a worker that read nothing before
        assert restored(store, ref) == files
    ref, _ = episode.step(**{"f1.py": "outside\n"})  # no episode named: a shared tree
    assert ref.key == keys.tree_key(ref.sha256) and restored(store, ref) == episode.files


def test_a_worker_that_died_after_its_upload_or_a_retry_leaves_every_ref_restorable(
    store: ObjectStore, folder: None
) -> None:
    """A step's PUT landed, then its worker died before the ref was recorded: the retry, on
    another worker restoring the step before, stores its own tree against the same base (the
    orphan beside it), and the episode goes on from the retry's; every recorded ref restores
    the tree it was returned for."""
    episode = Episode.started(StoreObjects(store), {f"f{n}.py": f"{n}\n" for n in range(30)})
    for n in range(5):
        episode.step(**{f"f{n}.py": f"step {n}\n"})
    retry, recorded = episode.elsewhere(), [(episode.ref, dict(episode.files))]
    orphan, _ = episode.step(**{"f9.py": "the first attempt\n"})  # the worker dies here
    for n in range(10):
        ref, _ = retry.step(**{"f9.py": "the retry\n", f"f{n}.py": f"retried {n}\n"})
        recorded.append((ref, dict(retry.files)))
    assert orphan.key not in {ref.key for ref, _ in recorded}
    assert restored(store, orphan)["f9.py"] == "the first attempt\n"
    for ref, expected in recorded:
        assert restored(store, ref) == expected


class Failing(StoreObjects):
    """The store, whose next PUT fails (the worker lost the store mid-step)."""

    fail = False

    def put(self, key: str, data: bytes) -> None:
        if self.fail:
            self.fail = False
            raise OSError("connection reset")
        super().put(key, data)


def test_a_failed_upload_leaves_no_ref_and_the_step_stores_again(
    store: ObjectStore, folder: None
) -> None:
    objects = Failing(store)
    episode = Episode.started(objects, {f"f{n}.py": f"{n}\n" for n in range(30)})
    for n in range(3):
        episode.step(**{f"f{n}.py": f"step {n}\n"})
    again = episode.elsewhere()  # the step runs again, from its state
    objects.fail = True
    with pytest.raises(OSError):
        episode.step(**{"f7.py": "lost\n"})
    episode = again
    for n in range(6):
        ref, _ = episode.step(**{"f7.py": "stored\n", f"g{n}.py": "g\n"})
        assert restored(store, ref) == episode.files


def test_a_chain_whose_base_is_gone_is_an_error_never_a_wrong_tree(
    store: ObjectStore, folder: None
) -> None:
    episode = Episode.started(StoreObjects(store), {f"f{n}.py": f"{n}\n" for n in range(30)})
    for n in range(1, 6):
        ref, _ = episode.step(**{f"f{n}.py": f"{n}!\n"})
    head = head_of(store.get_bytes(ref.key))
    assert head is not None and head.base is not None and head.base.key != ref.key
    store.delete(head.base.key)
    with pytest.raises(TreeError, match=f"no tree at {head.base.key}"):
        Trees(StoreObjects(store)).get_manifest(ref)


@needs_root
@pytest.mark.asyncio
async def test_a_step_in_an_episodes_context_stores_its_snapshot_in_the_folder(rig: Rig) -> None:
    """What the `env_step` activity would do around `WorkspaceEnvironment.step`: the snapshot,
    committed in a thread of the step, lies in the episode's folder, and a session restored
    from it elsewhere holds what the step wrote."""
    spec = rig.spec({"a.txt": "a\n"})
    state = await rig.env.reset(spec, "s0")
    write = ToolCall(name="write_file", arguments={"path": "b.txt", "content": "b\n"})
    with episode_folder("run1", "t", 0):
        state, _ = await rig.env.step(state, write, SandboxLimits(timeout_s=10), 1)
    assert state.snapshot.key.startswith(keys.episode_snapshots_prefix("run1", "t", 0))
    assert state.snapshot.key in rig.objects
    restored = await rig.env.reset(spec, "elsewhere", state.snapshot)
    assert restored.tree_digest == state.tree_digest
