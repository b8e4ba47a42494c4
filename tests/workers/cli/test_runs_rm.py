"""A `tempered runs rm` that stops half way (S3 fails, Ctrl-C) is finished by running it again:
the run's own objects go last, so the rerun still finds the run. Before, they went first, and
the rerun stopped at "unknown run" with the evaluations and cached policies left for good."""

from __future__ import annotations

from datetime import datetime, tzinfo
from pathlib import Path

import pytest

from infra import keys
from infra.seaweed import pick_free_ports
from infra.settings import Settings, TemporalSettings
from infra.storage import ObjectStore, TransientStorageError
from tests.fixtures.s3 import SeaweedServer
from workers.cli import run, runs_remove

RUN = "demo"
EVALUATIONS = ("demo-eval-v0", "demo-eval-v3-humaneval")
Capture = pytest.CaptureFixture[str]


@pytest.fixture
def settings(seaweed: SeaweedServer, store: ObjectStore, tmp_path: Path) -> Settings:
    """The test's bucket; a Temporal nothing listens at (`rm --force` goes on without it)."""
    return Settings(
        home=tmp_path,
        s3=seaweed.settings.model_copy(update={"bucket": store.bucket}),
        temporal=TemporalSettings(address=f"127.0.0.1:{pick_free_ports()[0]}"),
    )


@pytest.mark.parametrize("failing", [2, 3], ids=["in an evaluation", "in the run itself"])
def test_an_interrupted_rm_is_finished_by_a_rerun(
    failing: int,
    store: ObjectStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Capture,
) -> None:
    for key in (keys.run_record_key(RUN), keys.trajectory_key(RUN, "t", 0), "runs/demo2/x"):
        store.put_text(key, "{}")
    for evaluation in EVALUATIONS:
        store.put_text(keys.trajectory_key(evaluation, "t", 0), "{}")
    cached = settings.policy_cache / RUN / "v000001"
    cached.mkdir(parents=True)
    calls = []
    real_delete = ObjectStore.delete_keys

    def delete_keys(self: ObjectStore, doomed: list[str]) -> int:  # S3 fails on call `failing`
        calls.append(doomed)
        if len(calls) == failing:
            raise TransientStorageError("delete: S3 at http://s3 is unavailable (503)")
        return real_delete(self, doomed)

    monkeypatch.setattr(ObjectStore, "delete_keys", delete_keys)
    assert run(["runs", "rm", RUN, "--force"], settings) == 2
    err = capsys.readouterr().err
    assert err.startswith("tempered runs: delete: S3 at http://s3 is unavailable (503); ")
    assert f"rm of run {RUN} stopped; done: " in err and len(err.splitlines()) == 1
    assert "evaluation demo-eval-v0" in err and f"run `tempered runs rm {RUN}` again" in err
    assert ("its cached policies" in err) == (failing == 3)

    monkeypatch.setattr(ObjectStore, "delete_keys", real_delete)
    assert run(["runs", "rm", RUN, "--force"], settings) == 0  # was: "unknown run 'demo'"
    assert f"deleted run {RUN}:" in capsys.readouterr().out
    assert list(store.list_keys(keys.RUNS_PREFIX)) == ["runs/demo2/x"]
    assert not cached.exists() and store.exists(keys.removed_run_key(RUN))


def test_a_rerun_finishes_the_run_an_rm_of_two_stopped_in(
    store: ObjectStore,
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: Capture,
) -> None:
    """`rm a b` stopped inside b: a was gone for good, and the rerun the error advised (`rm a
    b`) stopped at "unknown run 'a'" before b. A run with a removal record counts as one to
    finish; the rerun deletes what is left of b, and a again (nothing)."""
    for run_id in ("a", "b"):
        store.put_text(keys.run_record_key(run_id), "{}")
        store.put_text(keys.trajectory_key(run_id, "t", 0), "{}")
    real_delete = ObjectStore.delete_keys

    def delete_keys(self: ObjectStore, doomed: list[str]) -> int:
        if any(key.startswith("runs/b/") for key in doomed):
            raise TransientStorageError("delete: S3 at http://s3 is unavailable (503)")
        return real_delete(self, doomed)

    monkeypatch.setattr(ObjectStore, "delete_keys", delete_keys)
    assert run(["runs", "rm", "a", "b", "--force"], settings) == 2
    assert "run `tempered runs rm b` again" in capsys.readouterr().err
    monkeypatch.setattr(ObjectStore, "delete_keys", real_delete)
    assert run(["runs", "rm", "a", "b", "--force"], settings) == 0, capsys.readouterr().err
    assert list(store.list_keys(keys.RUNS_PREFIX)) == []
    assert run(["runs", "show", "a"], settings) == 2  # removed: no run to show
    assert "unknown run 'a'" in capsys.readouterr().err


def test_a_rerun_in_the_same_second_knows_the_run_was_removed(
    store: ObjectStore, settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    """The removal record holds its second: a rerun within it wrote the same bytes, which a
    create-only write takes, and said "deleted run demo: 0 objects" as a first removal (it
    failed test_runs.py once in CI). The record is looked up, not inferred from the write."""
    store.put_text(keys.run_record_key(RUN), "{}")

    class FrozenClock(datetime):
        @classmethod
        def now(cls, tz: tzinfo | None = None) -> FrozenClock:
            return cls(2026, 12, 6, 15, 0, 0, tzinfo=tz)

    monkeypatch.setattr(runs_remove, "datetime", FrozenClock)
    assert run(["runs", "rm", RUN, "--force"], settings) == 0
    assert f"deleted run {RUN}: 1 objects" in capsys.readouterr().out
    assert run(["runs", "rm", RUN, "--force"], settings) == 0
    assert f"run {RUN} was removed already" in capsys.readouterr().out


def test_rm_aborts_the_runs_incomplete_uploads(
    store: ObjectStore, settings: Settings, capsys: Capture
) -> None:
    """A learner killed mid-publish leaves a multipart upload's parts stored, listed by no list
    of keys: `rm` deleted the run's objects and kept those parts for good. It aborts the
    uploads under the run's prefix and its evaluations' (another run's stay)."""
    store.put_text(keys.run_record_key(RUN), "{}")
    client = store._client
    orphans = [f"runs/{RUN}/policy/blobs/b1", f"runs/{EVALUATIONS[0]}/x", "runs/demo2/policy/b"]
    store.put_text(keys.trajectory_key(EVALUATIONS[0], "t", 0), "{}")
    for key in orphans:
        upload = client.create_multipart_upload(Bucket=store.bucket, Key=key)["UploadId"]
        client.upload_part(
            Bucket=store.bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"x" * 1024
        )  # ... and the writer dies here: no complete, no abort

    assert run(["runs", "rm", RUN, "--force"], settings) == 0, capsys.readouterr().err
    assert "2 incomplete uploads" in capsys.readouterr().out
    left = client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
    assert [upload["Key"] for upload in left] == ["runs/demo2/policy/b"]
