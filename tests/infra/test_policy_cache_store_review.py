"""The policy cache serves what the store holds now (real SeaweedFS; infra/policy_cache.py).

The cache was keyed by run id and version alone: after the bucket was replaced (dropped and
created again, a wiped store) or with another bucket (`s3.bucket`), a new run of the same id
got the weights cached for the old one. A cached version is now checked against the store's
manifest, read once per process and version."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from contracts.learner import PolicyManifest
from infra import keys, policy_cache
from infra.policy import policy_manifest, publish_policy
from infra.policy_cache import fetch_policy
from infra.storage import ObjectNotFound, ObjectStore
from tests.fixtures.policy_dirs import WEIGHTS, version_dir
from tests.fixtures.s3 import SeaweedServer
from tests.paths import REPO_ROOT as REPO

RUN = "exp1"
FETCH = """
import sys
from pathlib import Path
from pydantic import SecretStr
from infra.settings import S3Settings
from infra.storage import ObjectStore
from infra.policy_cache import fetch_policy
endpoint, bucket, secret, cache = sys.argv[1:5]
s3 = S3Settings(endpoint=endpoint, bucket=bucket, access_key="test-key",
                secret_key=SecretStr(secret))
local = fetch_policy(ObjectStore(s3), "exp1", 1, Path(cache), keep=6)
sys.stdout.write((local / "model.safetensors").read_text())
"""


def _fetch_in_a_new_process(seaweed: SeaweedServer, bucket: str, cache: Path) -> str:
    secret = seaweed.settings.secret_key.get_secret_value()
    done = subprocess.run(
        [sys.executable, "-c", FETCH, seaweed.endpoint, bucket, secret, str(cache)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_a_replaced_bucket_is_not_served_the_old_runs_weights(
    seaweed: SeaweedServer, store: ObjectStore, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    publish_policy(store, RUN, 1, version_dir(tmp_path, "weights of the OLD exp1"))
    assert _fetch_in_a_new_process(seaweed, store.bucket, cache) == "weights of the OLD exp1"
    seaweed.drop(store.bucket)  # the store wiped, the bucket made again, the run started again
    again = seaweed.store(store.bucket)
    assert not again.exists(keys.policy_manifest_key(RUN, 1))
    publish_policy(again, RUN, 1, version_dir(tmp_path, "weights of the NEW exp1"))
    assert _fetch_in_a_new_process(seaweed, store.bucket, cache) == "weights of the NEW exp1"


def test_another_bucket_is_not_served_the_first_ones_weights(
    seaweed: SeaweedServer, store: ObjectStore, tmp_path: Path
) -> None:
    other = seaweed.store()
    try:
        cache = tmp_path / "cache"
        publish_policy(store, RUN, 1, version_dir(tmp_path, "first bucket's"))
        publish_policy(other, RUN, 1, version_dir(tmp_path, "other bucket's"))
        assert (fetch_policy(store, RUN, 1, cache) / WEIGHTS).read_text() == "first bucket's"
        assert (fetch_policy(other, RUN, 1, cache) / WEIGHTS).read_text() == "other bucket's"
        assert (fetch_policy(store, RUN, 1, cache) / WEIGHTS).read_text() == "first bucket's"
    finally:
        seaweed.drop(other.bucket)


def test_a_process_reads_a_versions_manifest_once(store: ObjectStore, tmp_path: Path) -> None:
    publish_policy(store, RUN, 1, version_dir(tmp_path, "v1"))
    publish_policy(store, RUN, 2, version_dir(tmp_path, "v2"))
    reads: Counter[str] = Counter()

    def count(params: dict[str, Any], **_: Any) -> None:
        reads[params["Key"]] += 1

    store._client.meta.events.register("provide-client-params.s3.GetObject", count)
    cache = tmp_path / "cache"
    built: set[tuple[int, int]] = set()
    for _ in range(3):
        for version in (1, 2):
            local = fetch_policy(store, RUN, version, cache)
            assert (local / WEIGHTS).read_text() == f"v{version}"
            built.add((version, local.stat().st_ino))
    assert len(built) == 2  # a hit is not built again
    manifests = {k: n for k, n in reads.items() if k.endswith("manifest.json")}
    assert manifests == {keys.policy_manifest_key(RUN, 1): 1, keys.policy_manifest_key(RUN, 2): 1}


def test_the_cache_reads_a_manifest_as_the_policy_store_does(
    store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One rule one home: the cache asks `infra.policy.policy_manifest` (no key of its own)."""
    publish_policy(store, RUN, 1, version_dir(tmp_path, "v1"))
    asked: list[tuple[str, int]] = []

    def reading(store: ObjectStore, run_id: str, version: int) -> PolicyManifest | None:
        asked.append((run_id, version))
        return policy_manifest(store, run_id, version)

    monkeypatch.setattr(policy_cache, "policy_manifest", reading)
    monkeypatch.setattr(policy_cache, "_checked", {})  # a new process
    cache = tmp_path / "cache"
    assert (fetch_policy(store, RUN, 1, cache) / WEIGHTS).read_text() == "v1"
    with pytest.raises(ObjectNotFound, match="never published"):  # None: what callers catch
        fetch_policy(store, RUN, 7, cache)
    assert asked == [(RUN, 1), (RUN, 7)]
