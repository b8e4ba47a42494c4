"""A run's old policy versions go, and what is still needed stays (real SeaweedFS;
infra/retention.py): a finished run's (`prune_versions`, `tempered runs prune`) and, while a run
trains, those below a bound (`prune_below`, the `prune_policies` activity) without touching a
version being published. Which versions a run still reads: tests/workflows/test_training_run.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from infra import keys
from infra.policy import MANIFEST, policy_manifest, publish_policy
from infra.policy_cache import fetch_policy
from infra.retention import prune_below, prune_versions
from infra.storage import ObjectNotFound, ObjectStore
from tests.infra.test_policy_cache import _blobs, _publish_variants


def _named(store: ObjectStore, run: str) -> set[str]:
    """Blob keys the run's readable manifests name."""
    manifests = (policy_manifest(store, run, v) for v in range(8))
    return {ref.key for m in manifests if m for ref in m.files.values()}


def test_pruning_keeps_v0_the_newest_and_the_blobs_they_name(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    _publish_variants(store, "pruned", 5, tiny_dir, tmp_path)
    assert prune_versions(store, "pruned", keep=2) == [1, 2]
    kept = [policy_manifest(store, "pruned", v) for v in range(5)]
    assert [m is not None for m in kept] == [True, False, False, True, True]
    named = {ref.key for m in kept if m for ref in m.files.values()}
    assert set(_blobs(store, "pruned")) == named  # v1's and v2's own files went
    assert (fetch_policy(store, "pruned", 3, tmp_path / "cache") / MANIFEST).is_file()
    with pytest.raises(ObjectNotFound):
        fetch_policy(store, "pruned", 1, tmp_path / "cache")
    assert prune_versions(store, "pruned", keep=0) == [3, 4] and _blobs(store, "pruned")


def test_pruning_keeps_the_full_weights_a_kept_adapter_applies_to(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    from tests.infra.inference.policies import lora_adapter

    _publish_variants(store, "lora", 4, tiny_dir, tmp_path)
    adapter = lora_adapter(tiny_dir, tmp_path / "adapter")
    publish_policy(store, "lora", 4, adapter, step=4, adapter_of=2)
    assert prune_versions(store, "lora", keep=1) == [1, 3]  # v2 stays: v4 applies to it
    base = policy_manifest(store, "lora", 2)
    assert base is not None and {ref.key for ref in base.files.values()} <= set(
        _blobs(store, "lora")
    )
    assert (fetch_policy(store, "lora", 2, tmp_path / "cache") / MANIFEST).is_file()


def test_a_live_prune_deletes_the_versions_below_and_the_blobs_only_they_name(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    _publish_variants(store, "live", 5, tiny_dir, tmp_path)
    assert prune_below(store, "live", below=3) == [1, 2]
    kept = [policy_manifest(store, "live", v) is not None for v in range(5)]
    assert kept == [True, False, False, True, True]
    assert set(_blobs(store, "live")) == _named(store, "live")  # v1's and v2's own files went
    assert (fetch_policy(store, "live", 3, tmp_path / "cache") / MANIFEST).is_file()
    assert prune_below(store, "live", below=3) == []  # again: nothing more
    assert prune_below(store, "live", below=1) == []  # never version 0


def test_a_live_prune_spares_the_blobs_of_a_version_being_published(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    """Version 3 has uploaded a shard and not yet written its manifest: the live prune leaves
    the shard (its manifest will name it), the finished-run prune sweeps it."""
    _publish_variants(store, "busy", 3, tiny_dir, tmp_path)
    shard = tmp_path / "model-layer-0001.safetensors"
    shard.write_bytes(b"a shard of version 3, its manifest not written yet")
    digest = hashlib.sha256(shard.read_bytes()).hexdigest()
    store.upload_file(shard, keys.policy_blob_key("busy", digest), create_only=True)
    assert prune_below(store, "busy", below=2) == [1]
    assert keys.policy_blob_key("busy", digest) in _blobs(store, "busy")
    assert prune_versions(store, "busy", keep=1) == [] and set(_blobs(store, "busy")) == _named(
        store, "busy"
    )
