"""What a prune looks at (real SeaweedFS; infra/retention.py): a live prune given the bound of
the one before it (`since`) reads only the versions between the two bounds, and a finished run's
prune keeps the version latest.json names.

SeaweedFS keeps listing a pruned version's folder, so a live prune that looked at every listed
version re-read (404) and re-listed each version ever pruned: 1,500 versions on, one more prune
took 3,002 requests and 7.4 s, and a run's prunes cost the square of its steps."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from contracts.learner import PolicyManifest, PolicyVersion
from infra import keys
from infra.policy import advance_latest, policy_manifest, policy_versions
from infra.retention import prune_below, prune_versions
from infra.storage import ObjectStore


def publish_fakes(store: ObjectStore, run: str, versions: range, latest: bool = True) -> None:
    """Manifests of `versions` of `run`, each naming a one-byte blob of its own; latest.json
    advanced to the newest of them unless `latest` is False."""

    def publish(version: int) -> PolicyVersion:
        blob = keys.policy_blob_key(run, f"{version:064x}")
        ref = store.put_bytes(blob, f"v{version}".encode())
        policy = PolicyVersion(
            run_id=run, version=version, prefix=keys.policy_prefix(run, version), step=version
        )
        manifest = PolicyManifest(policy=policy, files={"w": ref})
        store.put_json(keys.policy_manifest_key(run, version), manifest, create_only=True)
        return policy

    with ThreadPoolExecutor(8) as pool:
        policies = list(pool.map(publish, versions))
    if latest:
        advance_latest(store, policies[-1])


def published(store: ObjectStore, run: str, count: int) -> list[int]:
    return [v for v in range(count) if policy_manifest(store, run, v) is not None]


@contextmanager
def counting(store: ObjectStore) -> Iterator[Counter[str]]:
    """The S3 requests `store` sends in the block, by operation."""
    sent: Counter[str] = Counter()

    def count(model: Any, **_: Any) -> None:
        sent[model.name] += 1

    events = store._client.meta.events
    events.register("before-call.s3", count)
    try:
        yield sent
    finally:
        events.unregister("before-call.s3", count)


def test_a_live_prune_given_the_last_bound_reads_only_the_versions_since(
    store: ObjectStore,
) -> None:
    publish_fakes(store, "long", range(60))
    assert prune_below(store, "long", below=57) == list(range(1, 57))
    assert len(policy_versions(store, "long")) == 60  # SeaweedFS lists the emptied folders
    with counting(store) as sent:
        assert prune_below(store, "long", below=59, since=57) == [57, 58]
    # before: a GET (404) and a LIST of each of the 56 versions pruned before, 112 requests more
    assert sum(sent.values()) <= 15, sent
    assert published(store, "long", 60) == [0, 59]
    assert set(store.list_keys(keys.policy_blob_key("long", ""))) == {
        keys.policy_blob_key("long", f"{v:064x}") for v in (0, 59)
    }


def test_a_live_prune_without_the_last_bound_looks_at_every_version(store: ObjectStore) -> None:
    """A request of an older run (no `since`) prunes as before: every listed version."""
    publish_fakes(store, "old", range(6))
    assert prune_below(store, "old", below=2, since=2) == []  # told 1 was done
    assert prune_below(store, "old", below=4) == [1, 2, 3]
    assert published(store, "old", 6) == [0, 4, 5]


def test_a_finished_runs_prune_keeps_the_version_latest_names(store: ObjectStore) -> None:
    """Version 3's manifest is written and latest.json still names 2 (its publisher died
    between the two): `--keep 1` kept 0 and 3 and deleted 2, the version a reader of
    latest.json loads."""
    publish_fakes(store, "behind", range(3))
    publish_fakes(store, "behind", range(3, 4), latest=False)
    assert prune_versions(store, "behind", keep=1) == [1]
    assert published(store, "behind", 4) == [0, 2, 3]
