"""A cached version rebuilt in place is never missing from its path, and what a killed rebuild
leaves is swept (real SeaweedFS; infra/policy_cache.py).

A rebuild (the cached manifest is not the store's: a bucket replaced, another bucket) removed
the old version's directory before it renamed the new one into place: a reader looking at
`<run>/v<N>/` in between found no version, and a pinned reader's path was gone."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from infra import policy_cache
from infra.policy import MANIFEST, publish_policy
from infra.policy_cache import cached_versions, fetch_policy, pin, unpin
from infra.storage import ObjectStore
from tests.fixtures.policy_dirs import WEIGHTS, version_dir
from tests.fixtures.s3 import SeaweedServer

RUN = "swap"


@pytest.fixture
def second(seaweed: SeaweedServer, store: ObjectStore, tmp_path: Path) -> Iterator[ObjectStore]:
    """A second bucket (dropped after the test): it and `store` each hold a different v1 of the
    same run id, "second" and "first"."""
    other = seaweed.store()
    publish_policy(store, RUN, 1, version_dir(tmp_path, "first"))
    publish_policy(other, RUN, 1, version_dir(tmp_path, "second"))
    try:
        yield other
    finally:
        seaweed.drop(other.bucket)


def test_a_rebuilt_version_is_never_missing_from_its_path(
    store: ObjectStore, second: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    local = fetch_policy(store, RUN, 1, cache)
    pinned = pin(local)  # an inference worker reading the cached v1
    assert pinned is not None
    seen: list[tuple[str, bool]] = []  # after each file-system step: is v1 there?

    def watched(step: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            done = step(*args, **kwargs)
            seen.append((step.__name__, (local / MANIFEST).is_file()))
            return done

        return run

    for module, name in ((shutil, "rmtree"), (os, "rename"), (os, "replace")):
        monkeypatch.setattr(module, name, watched(getattr(module, name)))
    rebuilt = fetch_policy(second, RUN, 1, cache)  # the cached v1 is not this bucket's
    monkeypatch.undo()
    assert rebuilt == local and (local / WEIGHTS).read_text() == "second"
    assert seen and all(there for _, there in seen), seen
    unpin(pinned)
    again = pin(local)  # the path holds the new version, pinnable like any
    assert again is not None
    unpin(again)
    assert [p.name for p in local.parent.iterdir()] == ["v1"]  # the old one went


def test_a_swap_without_an_atomic_exchange_still_replaces_the_version(
    store: ObjectStore, second: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    local = fetch_policy(store, RUN, 1, cache)
    monkeypatch.setattr(policy_cache, "_exchange", lambda a, b: False)  # e.g. NFS
    assert (fetch_policy(second, RUN, 1, cache) / WEIGHTS).read_text() == "second"
    assert [p.name for p in local.parent.iterdir()] == ["v1"]


def test_what_a_killed_rebuild_left_is_no_version_and_is_swept(
    store: ObjectStore, tmp_path: Path
) -> None:
    publish_policy(store, RUN, 1, version_dir(tmp_path, "v1"))
    publish_policy(store, RUN, 2, version_dir(tmp_path, "v2"))
    cache = tmp_path / "cache"
    v1 = fetch_policy(store, RUN, 1, cache, keep=1)
    # killed after the swap: the old version, complete, under its temporary name
    left = v1.parent / ".v1.0badf00d.tmp"
    assert left.name.startswith(".v1.") and left.name.endswith(".tmp")
    shutil.copytree(v1, left, copy_function=os.link)
    assert [p.name for p in cached_versions(cache)] == ["v1"]  # a leftover is no version
    fetch_policy(store, RUN, 2, cache, keep=1)  # evicts v1, then sweeps
    assert sorted(p.name for p in v1.parent.iterdir()) == ["v2"]
