"""What an episode's snapshots are stored against (real SeaweedFS): objects of its own folder
or the shared trees only, never another episode's, which retention deletes; and a session's
commits read nothing back from the store, however large its tree.

Before, one worker's manifest cache was keyed by digest: two episodes whose snapshots were
byte-identical (a first step that wrote no file: `mv`, `rm`, `mkdir`, `chmod`, once restores
gave files one fixed time) shared the first one's manifest, which lay in the other episode's
folder; the next step was stored against it, and once that folder was pruned the episode no
longer restored ("no tree at runs/run1/snapshots/t-e0--s0/…"). And a manifest over a quarter
of the cache was never kept, so every other commit of a large tree read its base's chain
again (6.4 MB over 32 steps of a 5,000-file tree).
"""

from __future__ import annotations

from contracts.common import ObjectRef
from infra import keys
from infra.environments.snapshot_chain import episode_folder
from infra.environments.snapshots import StoreObjects, Trees
from infra.environments.tree import FIXED_MTIME_NS, Entry, Manifest, pack_files, sha256
from infra.storage import ObjectStore

FILES = {f"f{n}.py": f"{n}\n" for n in range(20)}
MOVED = {("g0.py" if path == "f0.py" else path): text for path, text in FILES.items()}


class Recorded(StoreObjects):
    """The store, whose GETs are recorded (their keys)."""

    def __init__(self, store: ObjectStore) -> None:
        super().__init__(store)
        self.read: list[str] = []

    def get(self, key: str) -> bytes:
        self.read.append(key)
        return super().get(key)


def stored_task(store: ObjectStore, files: dict[str, str]) -> ObjectRef:
    packed = pack_files(files)
    for key, data in packed.objects.items():
        store.put_bytes(key, data)
    return packed.ref


def commit(
    trees: Trees, previous: Manifest, files: dict[str, str], times: dict[str, int]
) -> tuple[ObjectRef, Manifest]:
    entries: list[Entry] = pack_files(files).manifest.entries
    new = {sha256(text.encode()): text.encode() for text in files.values()}
    return trees.commit(entries, new, previous, mtimes=times)


def prune(store: ObjectStore, task: str) -> None:
    """What retention does once the episode's trajectory is written: its folder deleted."""
    prefix = keys.episode_snapshots_prefix("run1", task, 0)
    doomed = list(store.list_keys(prefix))
    assert doomed
    store.delete_keys(doomed)


def restores_from_its_own(store: ObjectStore, ref: ObjectRef, task: str) -> dict[str, str]:
    """The files a fresh worker restores from `ref`, checking it read only the episode's own
    folder and the shared trees."""
    objects = Recorded(store)
    trees = Trees(objects)
    manifest = trees.get_manifest(ref)
    contents = trees.get_contents(manifest)
    folder = keys.episode_snapshots_prefix("run1", task, 0)
    assert [key for key in objects.read if not key.startswith((folder, "workspaces/"))] == []
    return {entry.path: contents[entry.sha256].decode() for entry in manifest.files()}


def test_an_identical_snapshot_of_another_episode_is_never_a_base(store: ObjectStore) -> None:
    """The same task in two epochs on one worker, both making the same first change (`mv`: no
    file written, so byte-identical snapshots); epoch 0's folder is pruned, then epoch 1's
    step is retried (its state restored) and goes on: it restores on another worker."""
    task = stored_task(store, FILES)
    worker = Trees(StoreObjects(store))
    fixed = {path: FIXED_MTIME_NS for path in MOVED}
    with episode_folder("run1", "t-e0", 0):
        first, _ = commit(worker, worker.get_manifest(task), MOVED, fixed)
    prune(store, "t-e0")
    with episode_folder("run1", "t-e1", 0):
        ref, _ = commit(worker, worker.get_manifest(task), MOVED, fixed)
        assert ref.sha256 == first.sha256 and ref.key != first.key
        state = worker.get_manifest(ref)  # the step after it is retried: restored
        assert state._stored == ref
        later = dict(MOVED, **{"f1.py": "epoch 1's fix\n"})
        ref, _ = commit(worker, state, later, dict(fixed, **{"f1.py": FIXED_MTIME_NS + 7}))
    assert restores_from_its_own(store, ref, "t-e1") == later


def test_a_step_from_another_episodes_snapshot_names_none_of_its_objects(
    store: ObjectStore,
) -> None:
    """An episode whose state is another episode's snapshot (its contents and chain in that
    folder) stores its next step in its own folder, taking in what it needs: it restores once
    the other folder is pruned."""
    task = stored_task(store, FILES)
    worker = Trees(StoreObjects(store))
    files, times = dict(FILES), {path: FIXED_MTIME_NS for path in FILES}
    state = worker.get_manifest(task)
    with episode_folder("run1", "other", 0):
        for n in range(5):
            files[f"new{n}.py"], times[f"new{n}.py"] = f"written by the other {n}\n", n + 1
            _, state = commit(worker, state, files, times)
    with episode_folder("run1", "mine", 0):
        files["f3.py"], times["f3.py"] = "mine\n", 99
        ref, _ = commit(worker, state, files, times)
    prune(store, "other")
    assert restores_from_its_own(store, ref, "mine") == files


def test_a_sessions_commits_of_a_large_tree_read_nothing_back(store: ObjectStore) -> None:
    """A tree whose manifest is over a quarter of the worker's cache (here 2,000 files, a
    1 MB cache; by default some 58,000 files) is never kept there: the session's snapshot
    holds the trees its next steps are stored against."""
    files = {f"node_modules/p{n // 100}/f{n}.js": f"module {n}\n" for n in range(2000)}
    objects = Recorded(store)
    trees = Trees(objects, cache_bytes=1 << 20)
    manifest = trees.get_manifest(stored_task(store, files))
    entries = pack_files(files).manifest.entries
    times = {path: FIXED_MTIME_NS for path in files}
    reads = []
    with episode_folder("run1", "big", 0):
        for n in range(1, 33):
            text = f"step {n}\n"
            main = Entry(path="main.js", kind="file", sha256=sha256(text.encode()), size=len(text))
            times["main.js"] = FIXED_MTIME_NS + n
            objects.read.clear()
            ref, manifest = trees.commit(
                [*entries, main], {main.sha256: text.encode()}, manifest, mtimes=times
            )
            reads.append(len(objects.read))
    assert reads == [0] * 32
    files["main.js"] = "step 32\n"
    assert restores_from_its_own(store, ref, "big") == files
