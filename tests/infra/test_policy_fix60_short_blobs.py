"""A blob a crash left short is downloaded again, never trusted (real SeaweedFS;
infra/policy_cache.py).

The cache was built without fsync, and a blob already in `.blobs/` was reused whatever its
size: after a host crash an empty or short blob was served for ever, by the version that
linked it and by every later version naming it."""

from __future__ import annotations

import os
from pathlib import Path

from infra.policy import publish_policy
from infra.policy_cache import BLOBS, fetch_policy
from infra.storage import ObjectStore, sha256_bytes

WEIGHTS = "model.safetensors"


def _version(tmp_path: Path, tag: str, weights: bytes) -> Path:
    local = tmp_path / f"src-{tag}"
    local.mkdir()
    (local / "config.json").write_text(f'{{"tag": "{tag}"}}')
    (local / WEIGHTS).write_bytes(weights)
    return local


def test_a_short_blob_is_downloaded_again(store: ObjectStore, tmp_path: Path) -> None:
    weights = os.urandom(64 * 1024)
    publish_policy(store, "r", 0, _version(tmp_path, "v0", weights))
    publish_policy(store, "r", 1, _version(tmp_path, "v1", weights), step=1)  # shares it
    cache = tmp_path / "cache"
    v0 = fetch_policy(store, "r", 0, cache)
    blob = cache / BLOBS / sha256_bytes(weights)
    assert blob.is_file() and blob.name == sha256_bytes(weights)
    os.truncate(blob, 100)  # what a crash before its bytes reached the disk leaves
    v1 = fetch_policy(store, "r", 1, cache)  # a new version naming the short blob
    assert (v1 / WEIGHTS).read_bytes() == weights
    again = fetch_policy(store, "r", 0, cache)  # a cached version linking it
    assert again == v0 and (v0 / WEIGHTS).read_bytes() == weights


def test_an_empty_blob_is_downloaded_again(store: ObjectStore, tmp_path: Path) -> None:
    weights = os.urandom(4096)
    publish_policy(store, "r", 0, _version(tmp_path, "v0", weights))
    cache = tmp_path / "cache"
    v0 = fetch_policy(store, "r", 0, cache)
    os.truncate(v0 / WEIGHTS, 0)
    assert (fetch_policy(store, "r", 0, cache) / WEIGHTS).read_bytes() == weights
