"""A run's workspace snapshots go once nothing restores them (real SeaweedFS; infra/retention.py):
while the run trains, those of the episodes whose trajectory is written (`prune_snapshots`, run
by the `prune_policies` activity), never one of an episode still in flight, which restores and
goes on as before; once the run has finished, every one of it and of its evaluations
(`prune_versions`, `tempered runs prune`). The tasks' trees and other runs' snapshots stay."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from contracts.common import ObjectRef
from infra import keys
from infra.environments.snapshot_chain import episode_folder
from infra.environments.snapshots import StoreObjects
from infra.environments.tree import pack_files
from infra.retention import prune_snapshots, prune_versions
from infra.storage import ObjectStore
from tests.infra.environments.test_snapshot_folders import Episode, restored

FILES = {f"src/m{n}.py": f"def f():\n    return {n}\n" for n in range(20)}


def stepped(store: ObjectStore, run: str, task: str, sample: int, steps: int = 5) -> Episode:
    """An episode of `run` that took `steps` steps, its snapshots in its folder."""
    episode = Episode.started(StoreObjects(store), FILES)
    with episode_folder(run, task, sample):
        for n in range(steps):
            episode.step(**{f"src/m{n}.py": f"step {n}\n", f"new{n}.txt": "new\n"})
    return episode


def done(store: ObjectStore, run: str, task: str, sample: int) -> None:
    """The episode's trajectory is written (what the prune reads is its key)."""
    store.put_bytes(keys.trajectory_key(run, task, sample), b"{}")


def folder(store: ObjectStore, run: str, task: str, sample: int) -> list[str]:
    return list(store.list_keys(keys.episode_snapshots_prefix(run, task, sample)))


def test_a_live_prune_deletes_only_the_snapshots_of_episodes_that_are_done(
    store: ObjectStore,
) -> None:
    stepped(store, "live", "t", 0)
    flying = stepped(store, "live", "t", 1)
    other_task, other_run = stepped(store, "live", "t-e1", 0), stepped(store, "other", "t", 0)
    done(store, "live", "t", 0)
    done(store, "other", "t", 0)
    assert folder(store, "live", "t", 0)
    assert prune_snapshots(store, "live") == 5
    assert not folder(store, "live", "t", 0)
    assert len(folder(store, "live", "t", 1)) == len(folder(store, "live", "t-e1", 0)) == 5
    assert len(folder(store, "other", "t", 0)) == 5  # done, but another run's
    for episode in (flying, other_task, other_run):
        assert restored(store, episode.ref) == episode.files
    assert store.exists(pack_files(FILES).ref.key)  # the task's tree, which they started from
    elsewhere = flying.elsewhere()  # the episode in flight goes on, on another worker
    recorded: list[tuple[ObjectRef, dict[str, str]]] = []
    with episode_folder("live", "t", 1):
        for n in range(6):
            ref, _ = elsewhere.step(**{f"src/m{n}.py": None, f"later{n}.txt": "later\n"})
            recorded.append((ref, dict(elsewhere.files)))
    assert prune_snapshots(store, "live") == 0  # again: nothing more is done
    for ref, files in recorded:
        assert restored(store, ref) == files


def test_a_finished_runs_prune_deletes_its_snapshots_and_its_evaluations(
    store: ObjectStore,
) -> None:
    """Done or not: a task that failed wrote no trajectory, and nothing restores it now."""
    stepped(store, "fin", "t", 0)
    stepped(store, "fin", "t", 1)
    stepped(store, "fin-eval-v3", "held", 0)
    kept = [stepped(store, "fin2", "t", 0), stepped(store, "other", "t", 0)]
    done(store, "fin", "t", 0)
    assert prune_versions(store, "fin", keep=1) == []
    assert not list(store.list_keys(keys.snapshots_prefix("fin")))
    assert not list(store.list_keys(keys.snapshots_prefix("fin-eval-v3")))
    for episode in kept:  # a run whose id begins alike, and another run
        assert restored(store, episode.ref) == episode.files
    assert store.exists(keys.trajectory_key("fin", "t", 0))


def test_a_live_prune_lists_only_the_trajectories_of_tasks_with_snapshots(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It read every trajectory of the run each time (a prune a learner step: quadratic in the
    run's length); now those of the tasks whose episodes have snapshots, a task whose id
    extends another's (`t--s1`: `t`'s prefix lists it) told apart."""
    for n in range(30):  # done long ago, their snapshots pruned
        done(store, "long", f"old{n}", 0)
    stepped(store, "long", "t", 0, steps=1)
    stepped(store, "long", "t--s1", 0, steps=1)
    done(store, "long", "t--s1", 0)
    listed: list[str] = []
    real = store.list_keys

    def counted(prefix: str) -> Iterator[str]:
        for key in real(prefix):
            listed.append(key)
            yield key

    monkeypatch.setattr(store, "list_keys", counted)
    assert prune_snapshots(store, "long") == 1
    trajectories = [key for key in listed if key.startswith(keys.trajectories_prefix("long"))]
    assert trajectories == [keys.trajectory_key("long", "t--s1", 0)] * 2, trajectories
    assert folder(store, "long", "t", 0)
