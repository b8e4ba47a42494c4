"""Retention of a run's policy versions: which to delete, and the blobs only they name.

    prune_versions(store, run, keep=K)   # a finished run (`tempered runs prune`): all but v0
                                         # and the newest K, then every blob no kept one names
    prune_below(store, run, below=B)     # a run still training (`keep_versions`, activity
                                         # `prune_policies`): versions 1 .. B-1

Both keep version 0 and the full-weight versions that a kept LoRA version applies to
(`PolicyVersion.adapter_of`). Blobs are shared between versions (a version uploads only the
shards its step changed, `infra.policy`), so a blob goes only when no kept manifest names it.

While the run trains, a version may be mid-publish: its blobs are in the store and its manifest
is not yet. `prune_below` therefore deletes only blobs that a doomed version's manifest names:
a blob of the version being published is new (no manifest names it) or shared with the newest
published version (kept), unless its step restored a shard's exact bytes from before the kept
window, which nothing here guards against. What it leaves is what `prune_versions` sweeps once
the run has finished: blobs of crashed publishes that no manifest names. Which versions are still read (by
rollouts in flight and evaluations) is the caller's to know: `workflows/retention.py`.
"""

from __future__ import annotations

from contracts.learner import PolicyManifest
from infra import keys
from infra.policy import policy_manifest, policy_versions
from infra.storage import ObjectStore


def prune_versions(store: ObjectStore, run_id: str, keep: int) -> list[int]:
    """Delete the versions of a finished run but version 0 and the newest `keep`, then every
    blob no kept version names. Returns the versions deleted (an S3 store may still list their
    empty prefixes). The caller makes sure nothing serves the run any more."""
    versions = policy_versions(store, run_id)
    kept = {0, *versions[-keep:]} if keep > 0 else {0}
    return _prune(store, run_id, versions, kept, sweep=True)


def prune_below(store: ObjectStore, run_id: str, below: int) -> list[int]:
    """Delete versions 1 .. `below` - 1 of a run that may still be publishing, and the blobs
    that only they name. Returns the versions deleted; repeating it deletes nothing more."""
    versions = policy_versions(store, run_id)
    kept = {v for v in versions if v == 0 or v >= below}
    return _prune(store, run_id, versions, kept, sweep=False)


def _prune(
    store: ObjectStore, run_id: str, versions: list[int], kept: set[int], *, sweep: bool
) -> list[int]:
    """Delete `versions` not in `kept` (nor a kept adapter's base) and their blobs; with
    `sweep`, every blob of the run that no kept manifest names."""

    def manifests_of(chosen: set[int]) -> dict[int, PolicyManifest | None]:
        return {v: policy_manifest(store, run_id, v) for v in chosen}

    kept_manifests = manifests_of(kept)
    bases = {m.policy.adapter_of for m in kept_manifests.values() if m} - {None, *kept_manifests}
    kept_manifests |= manifests_of({v for v in bases if v is not None})
    doomed = [v for v in versions if v not in kept_manifests]
    if sweep:
        candidates = set(store.list_keys(keys.policy_blob_key(run_id, "")))
    else:  # read before their manifests go
        candidates = {
            ref.key for m in manifests_of(set(doomed)).values() if m for ref in m.files.values()
        }
    deleted = [  # its manifest, and any file of the older per-version layout
        v for v in doomed if store.delete_prefix(keys.policy_prefix(run_id, v))
    ]
    named = {ref.key for m in kept_manifests.values() if m for ref in m.files.values()}
    store.delete_keys(sorted(candidates - named))
    return deleted
