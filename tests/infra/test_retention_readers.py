"""A version that a reader outside the run marks as read (`reading`: `tempered eval --run R`)
stays while the marker lives, whatever bound the run's prunes pass (real SeaweedFS;
infra/retention.py). Before, the run knew only the readers it started: an evaluation from the
CLI lost its version two learner steps after it was published (`keep_versions` 2).

A marker lives while its reader refreshes it, and no longer than `ttl_s` after the last
refresh (a reader killed without a word pins nothing for ever); once ended or stale, the next
prune deletes the version it kept, below the bound it was given, and the marker."""

from __future__ import annotations

import time

from infra import keys
from infra.retention import prune_below, prune_versions, reading
from infra.storage import ObjectStore
from tests.infra.test_retention_bounds import publish_fakes, published


def markers(store: ObjectStore, run: str) -> list[str]:
    return list(store.list_keys(keys.policy_readers_prefix(run)))


def test_a_live_prune_keeps_a_version_read_and_deletes_it_once_its_reader_ends(
    store: ObjectStore,
) -> None:
    publish_fakes(store, "read", range(6))
    with reading(store, "read", 2, "read-eval-v2-starter-x"):
        assert prune_below(store, "read", below=4, since=1) == [1, 3]
        assert published(store, "read", 6) == [0, 2, 4, 5]
        assert store.exists(keys.policy_blob_key("read", f"{2:064x}"))  # its blob too
        assert prune_below(store, "read", below=5, since=4) == [4]
    assert markers(store, "read")  # ended, kept until a prune has dealt with its version
    assert prune_below(store, "read", below=5, since=5) == [2]  # below the bound it is given
    assert published(store, "read", 6) == [0, 5]
    assert not store.exists(keys.policy_blob_key("read", f"{2:064x}"))
    assert markers(store, "read") == []


def test_a_marker_not_refreshed_within_its_ttl_pins_nothing(store: ObjectStore) -> None:
    """Its reader was killed (or lost the store): the marker says `ended` to no one."""
    publish_fakes(store, "stale", range(4))
    with reading(store, "stale", 1, "gone", ttl_s=0.5, refresh_s=3600):
        time.sleep(1.0)
        assert prune_below(store, "stale", below=3, since=1) == [1, 2]
        assert markers(store, "stale") == []


def test_a_refreshed_marker_outlives_its_ttl(store: ObjectStore) -> None:
    publish_fakes(store, "fresh", range(4))
    with reading(store, "fresh", 1, "long-eval", ttl_s=1.0, refresh_s=0.2):
        time.sleep(2.0)
        assert prune_below(store, "fresh", below=3, since=1) == [2]


def test_a_finished_runs_prune_keeps_a_version_read_and_sweeps_ended_markers(
    store: ObjectStore,
) -> None:
    publish_fakes(store, "done", range(5))
    with reading(store, "done", 1, "eval-a"):
        with reading(store, "done", 2, "eval-b"):
            pass
        assert prune_versions(store, "done", keep=1) == [2, 3]
        assert markers(store, "done") == [keys.policy_reader_key("done", "eval-a")]
    assert prune_versions(store, "done", keep=1) == [1] and markers(store, "done") == []
