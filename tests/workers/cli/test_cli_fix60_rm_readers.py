"""`tempered runs rm RUN` while `tempered eval --run RUN --policy N` reads version N: the eval
marks it (`infra.retention.reading`) before its first task's workflow exists, so no workflow
told `rm` of it, and `rm` deleted `runs/RUN/` (the marker and the version with it) under the
eval, whose tasks then failed; `runs prune` keeps a version a live marker names. `rm` now
refuses a run a live marker reads (exit 2, nothing deleted), naming the reader and when its
marker expires, --force or not (--force is for a Temporal that cannot be asked); once the
reader has ended, `rm` deletes it as before.

Real SeaweedFS (the marker is the one `reading` writes); a Temporal nothing listens at (`rm
--force` goes on without it, as it would once Temporal said nothing works on the run)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from infra import keys
from infra.retention import reading
from infra.seaweed import pick_free_ports
from infra.settings import Settings, TemporalSettings
from infra.storage import ObjectStore
from tests.fixtures.s3 import SeaweedServer
from workers.cli import run

RUN = "demo"
READER = "demo-eval-v1--starter-abc"
Capture = pytest.CaptureFixture[str]


@pytest.fixture
def settings(seaweed: SeaweedServer, store: ObjectStore, tmp_path: Path) -> Settings:
    """The test's bucket; a Temporal nothing listens at (`rm --force` goes on without it)."""
    return Settings(
        home=tmp_path,
        s3=seaweed.settings.model_copy(update={"bucket": store.bucket}),
        temporal=TemporalSettings(address=f"127.0.0.1:{pick_free_ports()[0]}"),
    )


def stored_run(store: ObjectStore) -> None:
    for key in (keys.run_record_key(RUN), keys.policy_manifest_key(RUN, 1)):
        store.put_text(key, "{}")


def test_rm_refuses_a_run_a_live_reader_reads(
    store: ObjectStore, settings: Settings, capsys: Capture
) -> None:
    stored_run(store)
    with reading(store, RUN, 1, READER, ttl_s=600.0):
        started = time.time()
        assert run(["runs", "rm", RUN, "--force"], settings) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert store.exists(keys.policy_manifest_key(RUN, 1)), "rm deleted the version read"
        assert store.exists(keys.policy_reader_key(RUN, READER))
        assert not store.exists(keys.removed_run_key(RUN))
    assert f"run {RUN} is read" in err and READER in err and "v1" in err, err
    assert "nothing deleted" in err, err
    until = re.search(r"until (\S+Z)", err)
    assert until, err
    expires = datetime.strptime(until.group(1), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    assert abs(expires.timestamp() - (started + 600)) < 5, err

    # the reader ended (the block is left): its marker no longer keeps the run
    assert run(["runs", "rm", RUN, "--force"], settings) == 0
    assert f"deleted run {RUN}:" in capsys.readouterr().out
    assert list(store.list_keys(keys.run_prefix(RUN))) == []


def test_a_stale_marker_does_not_keep_the_run(
    store: ObjectStore, settings: Settings, capsys: Capture
) -> None:
    """A reader killed without a word: its marker, past `until`, keeps nothing (as for prune)."""
    stored_run(store)
    store.put_json(keys.policy_reader_key(RUN, READER), {"version": 1, "until": time.time() - 1})
    assert run(["runs", "rm", RUN, "--force"], settings) == 0, capsys.readouterr().err
    assert list(store.list_keys(keys.run_prefix(RUN))) == []


def test_rm_of_several_runs_refuses_before_it_deletes_any(
    store: ObjectStore, settings: Settings, capsys: Capture
) -> None:
    """`runs rm A demo` with demo read: A was deleted, then demo refused."""
    stored_run(store)
    store.put_text(keys.run_record_key("other"), "{}")
    with reading(store, RUN, 1, READER, ttl_s=600.0):
        assert run(["runs", "rm", "other", RUN, "--force"], settings) == 2
    assert f"run {RUN} is read" in capsys.readouterr().err
    assert store.exists(keys.run_record_key("other")), "rm deleted a run before it refused"
