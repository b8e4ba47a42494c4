"""A policy cache on a full disk frees room and goes on fetching (real SeaweedFS, a real small
tmpfs; infra/policy_cache.py).

Eviction ran only after a fetch succeeded: on a disk holding `keep` versions the next fetch
failed with ENOSPC before anything was evicted, every later fetch of a new version failed the
same way, and each try left its downloads behind. The cache runs in a child process with a
mount namespace of its own (`unshare -m`), where a tmpfs of `DISK_KIB` holds two versions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.policy import publish_policy
from infra.storage import ObjectStore
from tests.paths import REPO_ROOT

DISK_KIB = 2600
WEIGHTS_KIB = 1000  # two versions' weights fit the disk, three do not

pytestmark = pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0,
    reason="needs unshare and root (a tmpfs mounted in a mount namespace of its own)",
)

FETCHER = """
import json, os, sys
from pathlib import Path
from infra.policy_cache import fetch_policy
from infra.settings import S3Settings
from infra.storage import ObjectStore

s3, bucket, cache, keep, versions = json.loads(sys.argv[1])
store = ObjectStore(S3Settings(**s3), bucket)
cache = Path(cache)
outcomes = []
for version in versions:
    try:
        fetch_policy(store, "r", version, cache, keep)
        outcomes.append("ok")
    except OSError as err:
        outcomes.append(f"{type(err).__name__} {err.errno}")
run = cache / "r"
print(json.dumps({
    "outcomes": outcomes,
    "cached": sorted(p.name for p in run.iterdir()) if run.is_dir() else [],
    "blobs": sorted(p.name for p in (cache / ".blobs").iterdir()),
}))
"""


def _publish(store: ObjectStore, tmp_path: Path, count: int) -> None:
    for version in range(count):
        local = tmp_path / f"src{version}"
        local.mkdir()
        (local / "config.json").write_text(json.dumps({"v": version}))
        (local / "model.safetensors").write_bytes(os.urandom(WEIGHTS_KIB * 1024))
        publish_policy(store, "r", version, local, step=version)


def _fetch_on_small_disk(
    store: ObjectStore, tmp_path: Path, keep: int, versions: list[int]
) -> dict[str, list[str]]:
    """Fetch `versions` in order into a cache on a fresh tmpfs of DISK_KIB (gone with the
    child's mount namespace); what each fetch gave, and what was cached at the end."""
    disk = tmp_path / "disk"
    disk.mkdir()
    s3 = store.settings.model_dump(mode="json") | {
        "secret_key": store.settings.secret_key.get_secret_value()
    }
    args = json.dumps([s3, store.bucket, str(disk / "cache"), keep, versions])
    script = f'mount -t tmpfs -o size={DISK_KIB}k tmpfs "$1" && exec "$2" -c "$3" "$4"'
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", str(disk), sys.executable, FETCHER, args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, list[str]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_disk_holding_keep_versions_still_fetches_the_next(
    store: ObjectStore, tmp_path: Path
) -> None:
    _publish(store, tmp_path, 4)
    got = _fetch_on_small_disk(store, tmp_path, keep=2, versions=[0, 1, 2, 3, 1])
    assert got["outcomes"] == ["ok"] * 5
    assert got["cached"] == ["v1", "v3"]
    assert len(got["blobs"]) == 4  # each cached version's two files, nothing a try left


def test_a_disk_smaller_than_keep_versions_evicts_and_tries_again(
    store: ObjectStore, tmp_path: Path
) -> None:
    _publish(store, tmp_path, 4)
    # keep=4: room is never made before a download, so the third fetch fills the disk
    got = _fetch_on_small_disk(store, tmp_path, keep=4, versions=[0, 1, 2, 3])
    assert got["outcomes"] == ["ok"] * 4
    assert "v3" in got["cached"] and len(got["cached"]) <= 2
