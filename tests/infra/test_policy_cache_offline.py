"""A version cached complete is served while the store cannot be reached; a version the store
says is missing is not (real SeaweedFS, and a store on a closed port; infra/policy_cache.py).

A process whose store was down (connection refused) failed every fetch, even of a version it
had on disk: an inference worker restarted during an outage could not serve what it held."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from infra import keys, policy_cache
from infra.policy import publish_policy
from infra.policy_cache import fetch_policy
from infra.processes import free_port
from infra.storage import ObjectNotFound, ObjectStore, TransientStorageError
from tests.fixtures.policy_dirs import WEIGHTS, version_dir

RUN = "offline"


def _down(store: ObjectStore) -> ObjectStore:
    """The same bucket, through an endpoint nothing listens on (connection refused)."""
    closed = store.settings.model_copy(update={"endpoint": f"http://127.0.0.1:{free_port()}"})
    return ObjectStore(closed, store.bucket)


def test_a_cached_version_is_served_while_the_store_is_down(
    store: ObjectStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    publish_policy(store, RUN, 1, version_dir(tmp_path, "v1"))
    publish_policy(store, RUN, 2, version_dir(tmp_path, "v2"))
    cache = tmp_path / "cache"
    local = fetch_policy(store, RUN, 1, cache, keep=6)
    down = _down(store)  # a process started during the outage: it never read v1's manifest
    with pytest.raises(TransientStorageError):
        down.get_bytes(keys.policy_manifest_key(RUN, 1))  # the store is unreachable indeed
    with caplog.at_level(logging.WARNING, logger=policy_cache.__name__):
        assert fetch_policy(down, RUN, 1, cache, keep=6) == local
    assert (local / WEIGHTS).read_text() == "v1"
    assert any("unreachable" in r.getMessage() for r in caplog.records), caplog.records
    # not remembered as checked: the next fetch asks the store again
    assert (down.endpoint, down.bucket, RUN, 1) not in policy_cache._checked
    with pytest.raises(TransientStorageError):  # never cached: nothing to serve
        fetch_policy(down, RUN, 2, cache, keep=6)
    assert not (cache / RUN / "v2").exists()


def test_a_version_the_store_no_longer_holds_is_not_served_from_the_cache(
    store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    publish_policy(store, RUN, 1, version_dir(tmp_path, "v1"))
    cache = tmp_path / "cache"
    fetch_policy(store, RUN, 1, cache)
    store.delete(keys.policy_manifest_key(RUN, 1))  # pruned, or a bucket replaced
    monkeypatch.setattr(policy_cache, "_checked", {})  # a new process
    with pytest.raises(ObjectNotFound):
        fetch_policy(store, RUN, 1, cache)
