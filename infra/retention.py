"""Retention of a run's policy versions (which to delete, and the blobs only they name), of
its workspace snapshots and of its learner's stored groups.

    prune_versions(store, run, keep=K)   # a finished run (`tempered runs prune`): all but v0,
                                         # the one latest.json names and the newest K, then
                                         # every blob no kept one names; and every snapshot
                                         # of the run and of its evaluations
    prune_snapshots(store, run)          # a run still training (activity `prune_policies`):
                                         # the snapshots of the episodes that are done
    prune_below(store, run, below=B, since=S)   # a run still training (`keep_versions`,
                                         # activity `prune_policies`): versions S .. B-1, the
                                         # earlier ones deleted by the prunes before (S = None:
                                         # versions 1 .. B-1, every one listed looked at)
    prune_step_parts(store, run)         # the stored parts of the learner's groups: a live
                                         # prune (`prune_policies`) those of each step below
                                         # the newest ack, a finished run's (`prune_versions`)
                                         # every one
    with reading(store, run, version, reader):   # `tempered eval --run`: kept meanwhile
        ...

Both keep version 0 and the full-weight versions that a kept LoRA version applies to
(`PolicyVersion.adapter_of`). Blobs are shared between versions (a version uploads only the
shards its step changed, `infra.policy`), so a blob goes only when no kept manifest names it.

While the run trains, a version may be mid-publish: its blobs are in the store and its manifest
is not yet. `prune_below` therefore deletes only blobs that a doomed version's manifest names:
a blob of the version being published is new (no manifest names it) or shared with the newest
published version (kept), unless its step restored a shard's exact bytes from before the kept
window, which nothing here guards against. What it leaves is what `prune_versions` sweeps once
the run has finished: blobs of crashed publishes that no manifest names. It deletes those blobs
before the doomed versions' folders (their manifests): a prune stopped in between (the store
failed a request) is finished by its retry, which reads the same manifests again; the other
order left the retry no manifest naming the blobs, and they stayed for good. Which versions the
run's own rollouts and evaluations still read is the caller's to know (`workflows/retention.py`).

`since` keeps a live prune's cost to the versions it deletes: an S3 store may keep listing a
pruned version's emptied folder (SeaweedFS does), and a prune that looked at every listed
version read each one ever pruned again (1,500 versions on, 3,002 requests a prune).

A reader outside the run (`tempered eval --run R --policy N`, which the run does not know of)
marks its version (`reading`: `keys.policy_reader_key`), and both prunes keep a version a live
marker names. The marker lives `ttl_s` from its last refresh, every `refresh_s` while the block
runs, by the reader's clock, so a reader killed without a word pins its version no longer than
that (clocks that differ by more than `ttl_s - refresh_s` are not allowed for). On leaving the
block it is marked ended, not deleted: the next prune deletes the version it kept if that is
below its bound (it may be below `since`: nothing else would look at it again), then the marker.
Not covered: a prune that read the markers just before a reader wrote its one, and deletes the
version just after the reader looked for it again once marked (`tempered eval` looks, and
refuses to start where the version is gone).

Snapshots: a `workspace` episode's steps store its workspace in the episode's folder
(`keys.episode_snapshots_prefix`, infra/environments/snapshot_chain.py), read back only to
restore the episode's session elsewhere and, at DONE, to verify its final tree; its trajectory
is written after both, so an episode with a trajectory reads them no more, and neither does
anything else (a folder holds only its episode's objects: a snapshot that another one is
stored against, or whose contents it keeps using, is of the same episode, or is a shared tree
of `workspaces/`, which is never deleted here). A live prune deletes those folders, a
finished run's prune every folder of the run and of its evaluations. Not covered: the
snapshots of an episode that never wrote a trajectory (its task failed, or the run was
stopped) until the run's prune, nor those of a run without `keep_versions` (no live prune
runs) or of its evaluations (runs of their own) until then; snapshots that no step named the
episode of, or that an older build stored, among the shared trees, are never deleted.

A learner's stored groups (`keys.learner_step_groups_key`: a step's groups past a payload,
workflows/learner_request.py, and pending groups a segment hands on past one, workflows/
learner_carry.py; both named by the learner's step when stored) are read by every attempt of
that step's `train_step`, before it looks for its ack (a retry compares the ack's groups with
them), and by the next segment, before it trains that step. The ack of step s + 1 proves both
over for step s's parts: the learner asks step s + 1 only once step s's activity has completed
(no attempt of it is scheduled again; one left running reports to no one), and a segment reads
what its input names before it trains. Not so step s's own ack: an attempt whose heartbeats
were lost may have written it while the retry that reads the parts is still to come. So a live
prune deletes the parts of each step s whose step s + 1's ack it lists beside them (the newest
acknowledged step's, the step being stored and a carry at the learner's current step stay: at
most two steps' and a carry's, ~6 MB at 64 groups of G = 256), and a finished run's prune every
part. It lists the learner's folder each time (about a key a step: a request per 1,000 steps), so
a part stored after a prune (an orphaned attempt of `store_step_groups`) goes with the next.
Not covered until `runs prune`: the parts of a run without `keep_versions` (no live prune
runs), and a final state's carried parts and its last step's; nor a learner reset (Temporal) to
before a step that a prune running meanwhile finds acknowledged above.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator

from pydantic import BaseModel, ValidationError

from contracts.learner import PolicyManifest
from contracts.names import evaluates
from infra import keys
from infra.policy import latest_policy, policy_manifest, policy_versions
from infra.storage import ObjectNotFound, ObjectStore, StorageError

log = logging.getLogger(__name__)

READER_TTL_S = 1800.0
"""How long a reader's marker keeps its version after its last refresh."""
READER_REFRESH_S = 300.0
"""How often a reader refreshes its marker: a few refreshes may fail (the store down for a
while) before the marker goes stale."""


class PolicyReader(BaseModel):
    """A reader's marker (`keys.policy_reader_key`)."""

    version: int
    until: float = 0.0
    """Seconds since the epoch, by the reader's clock: stale from then on."""
    ended: bool = False


def prune_versions(store: ObjectStore, run_id: str, keep: int) -> list[int]:
    """Delete the versions of a finished run but version 0, the newest `keep` and (`keep` > 0)
    the one latest.json names, then every blob no kept version names, the workspace snapshots
    of the run and of its evaluations, and every stored part of its learner's groups
    (`prune_step_parts`). Returns the versions deleted (an S3 store may still list their empty
    prefixes). The caller makes sure nothing serves the run any more; a version a live reader
    marks stays all the same."""
    versions = policy_versions(store, run_id)
    live, ended = _readers(store, run_id)
    kept = {0, *live}
    if keep > 0:  # a publish that died between its manifest and latest.json left it behind
        latest = latest_policy(store, run_id)
        kept |= {*versions[-keep:], *([latest.version] if latest else [])}
    deleted = _prune(store, run_id, versions, kept, sweep=True)
    store.delete_keys(sorted(ended))
    evaluations = [
        run
        for prefix in store.list_prefixes(keys.RUNS_PREFIX)
        if evaluates(run := prefix.removeprefix(keys.RUNS_PREFIX).rstrip("/"), run_id)
    ]
    for run in (run_id, *evaluations):
        prune_snapshots(store, run, finished=True)
    prune_step_parts(store, run_id, finished=True)
    return deleted


def prune_snapshots(store: ObjectStore, run_id: str, finished: bool = False) -> int:
    """Delete the workspace snapshots of `run_id`'s episodes whose trajectory is written, or
    (`finished`: nothing works on the run any more) every one. Returns how many objects."""
    stored = list(store.list_keys(keys.snapshots_prefix(run_id)))
    if stored and not finished:  # the trajectories of the tasks with snapshots, not every one
        episodes = {key: keys.snapshot_episode(run_id, key) for key in stored}
        named = (keys.episode_of(episode or "") for episode in episodes.values())
        tasks = sorted({episode[0] for episode in named if episode is not None})
        done = {
            keys.trajectory_episode(run_id, key)
            for task in tasks
            for key in store.list_keys(keys.task_trajectories_prefix(run_id, task))
        }
        stored = [key for key in stored if episodes[key] in done]
    return store.delete_keys(stored)


def prune_step_parts(store: ObjectStore, run_id: str, finished: bool = False) -> int:
    """Delete the stored parts of `run_id`'s learner groups of each step whose next step is
    acknowledged, or (`finished`: no learner works on the run any more) every one. Returns how
    many objects."""
    listed = set(store.list_keys(keys.learner_prefix(run_id)))
    doomed = [
        key
        for key in sorted(listed)
        if (step := keys.learner_step_groups_of(run_id, key)) is not None
        and (finished or keys.learner_ack_key(run_id, step + 1) in listed)
    ]
    return store.delete_keys(doomed)


def prune_below(store: ObjectStore, run_id: str, below: int, since: int | None = None) -> list[int]:
    """Delete versions `since` .. `below` - 1 (1 .. `below` - 1 where `since` is None) of a run
    that may still be publishing, and the blobs that only they name, but those a live reader
    marks; and those that ended readers kept before, however old. Returns the versions
    deleted; after a failure (`StorageError`), calling it again with the same bounds finishes
    the prune, and repeating a finished one deletes nothing more."""
    versions = policy_versions(store, run_id)
    live, ended = _readers(store, run_id)
    kept = {v for v in versions if v == 0 or v >= below} | live
    if since is not None:  # those below it are deleted, or kept by a reader that has ended
        freed = {marker.version for marker in ended.values()}
        versions = [v for v in versions if since <= v < below or v in freed]
    deleted = _prune(store, run_id, versions, kept, sweep=False)
    store.delete_keys(sorted(ended))
    return deleted


@contextlib.contextmanager
def reading(
    store: ObjectStore,
    run_id: str,
    version: int,
    reader: str,
    *,
    ttl_s: float = READER_TTL_S,
    refresh_s: float = READER_REFRESH_S,
) -> Iterator[None]:
    """Keep `version` of `run_id` from its prunes while the block runs: `reader` (an id unique
    to this reader) marks it, and refreshes the marker from a thread. StorageError if the
    first mark fails; a failed refresh or end is logged (the marker goes stale)."""
    key = keys.policy_reader_key(run_id, reader)

    def mark(ended: bool = False) -> None:
        until = time.time() + (0.0 if ended else ttl_s)
        store.put_json(key, PolicyReader(version=version, until=until, ended=ended))

    def refresh() -> None:
        while not stop.wait(refresh_s):
            try:
                mark()
            except StorageError as err:  # the next refresh tries again
                log.warning("reader %s of %s v%d: refresh failed: %s", reader, run_id, version, err)

    mark()
    stop = threading.Event()
    refresher = threading.Thread(target=refresh, name=f"reading-{reader}", daemon=True)
    refresher.start()
    try:
        yield
    finally:
        stop.set()
        refresher.join()
        try:
            mark(ended=True)
        except StorageError as err:
            log.warning("reader %s of %s v%d: not marked ended: %s", reader, run_id, version, err)


def reader_markers(
    store: ObjectStore, run_id: str
) -> tuple[dict[str, PolicyReader], dict[str, PolicyReader]]:
    """The markers of `run_id`'s live readers, and of those that ended or went stale, by key
    (an unreadable one as ended, of version 0; one deleted since it was listed, in neither):
    the one rule of what a reader keeps (both prunes, `tempered runs rm`)."""
    live: dict[str, PolicyReader] = {}
    ended: dict[str, PolicyReader] = {}
    now = time.time()
    for key in store.list_keys(keys.policy_readers_prefix(run_id)):
        try:
            marker = store.get_model(key, PolicyReader)
        except ObjectNotFound:  # deleted since it was listed
            continue
        except ValidationError:
            marker = PolicyReader(version=0, ended=True)
        (ended if marker.ended or marker.until <= now else live)[key] = marker
    return live, ended


def _readers(store: ObjectStore, run_id: str) -> tuple[set[int], dict[str, PolicyReader]]:
    """The versions that live readers mark, and the markers of readers that ended or went stale
    (`reader_markers`)."""
    live, ended = reader_markers(store, run_id)
    return {marker.version for marker in live.values()}, ended


def _prune(
    store: ObjectStore, run_id: str, versions: list[int], kept: set[int], *, sweep: bool
) -> list[int]:
    """Delete `versions` not in `kept` (nor a kept adapter's base) and their blobs; with
    `sweep`, every blob of the run that no kept manifest names. The blobs go first, while the
    doomed manifests that name them are still there: an attempt stopped between the two leaves
    its retry the same blobs to find (deleting a deleted key is a success)."""

    def manifests_of(chosen: set[int]) -> dict[int, PolicyManifest | None]:
        return {v: policy_manifest(store, run_id, v) for v in chosen}

    kept_manifests = manifests_of(kept)
    bases = {m.policy.adapter_of for m in kept_manifests.values() if m} - {None, *kept_manifests}
    kept_manifests |= manifests_of({v for v in bases if v is not None})
    doomed = [v for v in versions if v not in kept_manifests]
    if sweep:
        candidates = set(store.list_keys(keys.policy_blob_key(run_id, "")))
    else:  # only what a doomed manifest names: a version mid-publish has none yet
        candidates = {
            ref.key for m in manifests_of(set(doomed)).values() if m for ref in m.files.values()
        }
    named = {ref.key for m in kept_manifests.values() if m for ref in m.files.values()}
    store.delete_keys(sorted(candidates - named))
    return [  # its manifest, and any file of the older per-version layout
        v for v in doomed if store.delete_prefix(keys.policy_prefix(run_id, v))
    ]
