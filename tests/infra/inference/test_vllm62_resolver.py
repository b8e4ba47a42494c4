"""A version that was published and later deleted by retention (`keep_versions`' live prune,
`tempered runs prune`) leaves no trace the resolver could tell from a version never published:
its error said "was never published", sending whoever read it after a learner that never was at
fault. It names both now. Against a real SeaweedFS (tests/fixtures/s3.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.inference import InferenceError, PolicyResolver
from infra.policy import publish_policy
from infra.retention import prune_below
from infra.storage import ObjectStore


@pytest.mark.asyncio
async def test_a_version_retention_deleted_is_not_called_never_published(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    for version in range(3):
        publish_policy(store, "pruned", version, tiny_dir, step=version)
    assert prune_below(store, "pruned", below=2) == [1]
    with pytest.raises(InferenceError, match="deleted by retention") as gone:
        await PolicyResolver(store, tmp_path, wait_s=60).resolve("pruned", 1)
    assert not gone.value.retryable
    assert "the newest is v2" in str(gone.value)
