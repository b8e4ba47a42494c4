"""ObjectStore against a real SeaweedFS: round-trips, create-only, multipart, typed errors."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from contracts.common import ObjectRef
from contracts.task import TaskSpec
from infra.seaweed import pick_free_ports
from infra.storage import (
    DigestMismatch,
    ObjectExists,
    ObjectNotFound,
    ObjectStore,
    PermanentStorageError,
    TransientStorageError,
    sha256_bytes,
)
from infra.storage_checks import PROBE_PREFIX, check_create_only
from infra.storage_multipart import MULTIPART_THRESHOLD
from tests.fixtures.s3 import SeaweedServer


def test_round_trips(store: ObjectStore) -> None:
    ref = store.put_bytes("a/bytes", b"\x00\x01payload")
    assert ref == ObjectRef(key="a/bytes", size=9, sha256=sha256_bytes(b"\x00\x01payload"))
    assert store.get_bytes("a/bytes") == b"\x00\x01payload"
    store.put_text("a/text", "héllo")
    assert store.get_text("a/text") == "héllo"
    store.put_json("a/dict", {"b": 1, "a": [1, 2]})
    assert store.get_json("a/dict") == {"a": [1, 2], "b": 1}
    task = TaskSpec(id="t1", prompt="p", entry_point="f", tests="assert True")
    store.put_json("a/model", task)
    assert store.get_model("a/model", TaskSpec) == task
    assert store.head("a/bytes") == ref
    assert store.exists("a/text") and not store.exists("a/none")
    assert store.head("a/none") is None
    store.delete("a/text")
    assert not store.exists("a/text")
    with pytest.raises(ObjectNotFound, match="a/text not found"):
        store.get_bytes("a/text")


def test_put_json_is_deterministic(store: ObjectStore) -> None:
    first = store.put_json("d1", {"z": 1, "a": {"y": 2, "b": 3}})
    second = store.put_json("d2", {"a": {"b": 3, "y": 2}, "z": 1})
    assert first.sha256 == second.sha256


def test_create_only_is_idempotent_for_identical_content(store: ObjectStore) -> None:
    first = store.put_bytes("once", b"same", create_only=True)
    again = store.put_bytes("once", b"same", create_only=True)
    assert again == first
    with pytest.raises(ObjectExists, match="already holds different content"):
        store.put_bytes("once", b"different", create_only=True)
    assert store.get_bytes("once") == b"same"
    assert store.put_once("once", b"same") == (first, False)  # a retry: stored, not created
    with pytest.raises(ObjectExists):
        store.put_once("once", b"different")
    assert store.put_once("twice", b"same", content_type="text/plain") == (
        first.model_copy(update={"key": "twice"}),
        True,
    )


def test_identical_writers_racing_create_it_once(store: ObjectStore) -> None:
    """Writers of the same bytes all get its ref, and exactly one of them created it."""
    contenders = 8
    barrier = threading.Barrier(contenders)
    created: list[bool] = []

    def contend() -> None:
        barrier.wait()
        created.append(store.put_once("same-raced", b"same")[1])

    threads = [threading.Thread(target=contend) for _ in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(created) == [False] * (contenders - 1) + [True]


def test_create_only_race_has_exactly_one_winner(store: ObjectStore) -> None:
    contenders = 8
    barrier = threading.Barrier(contenders)
    won: list[bytes] = []
    lost: list[Exception] = []

    def contend(i: int) -> None:
        body = f"writer-{i}".encode()
        barrier.wait()
        try:
            store.put_bytes("raced", body, create_only=True)
            won.append(body)
        except ObjectExists as exc:
            lost.append(exc)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and len(lost) == contenders - 1
    assert store.get_bytes("raced") == won[0]


def test_create_only_without_stored_digest_hashes_the_body(store: ObjectStore) -> None:
    store._client.put_object(Bucket=store.bucket, Key="foreign", Body=b"from elsewhere")
    ref = store.put_bytes("foreign", b"from elsewhere", create_only=True)
    assert ref.sha256 == sha256_bytes(b"from elsewhere")


def test_multipart_upload_and_download(store: ObjectStore, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(MULTIPART_THRESHOLD + 3 * 2**20 + 17))
    ref = store.upload_file(big, "ckpt/model.safetensors", create_only=True)
    assert ref.size == big.stat().st_size
    assert store.head(ref.key) == ref
    assert store.upload_file(big, ref.key, create_only=True) == ref  # retry: no-op
    other = tmp_path / "other.bin"
    other.write_bytes(os.urandom(MULTIPART_THRESHOLD + 1))
    with pytest.raises(ObjectExists):
        store.upload_file(other, ref.key, create_only=True)
    store.download_file(ref.key, tmp_path / "back" / "model.safetensors")
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == big.read_bytes()


def test_upload_and_download_dir(store: ObjectStore, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text("{}")
    (src / "sub" / "weights.bin").write_bytes(b"w" * 1000)
    refs = store.upload_dir(src, "runs/r/policy/v000001/")
    assert [r.key for r in refs] == [
        "runs/r/policy/v000001/config.json",
        "runs/r/policy/v000001/sub/weights.bin",
    ]
    written = store.download_dir("runs/r/policy/v000001", tmp_path / "dst")
    assert sorted(p.relative_to(tmp_path / "dst").as_posix() for p in written) == [
        "config.json",
        "sub/weights.bin",
    ]
    assert (tmp_path / "dst" / "sub" / "weights.bin").read_bytes() == b"w" * 1000


def test_list_keys_paginates(seaweed: SeaweedServer, store: ObjectStore) -> None:
    paged = ObjectStore(seaweed.settings, store.bucket, page_size=3)
    keys = [f"p/{i:02d}" for i in range(10)]
    for key in keys:
        paged.put_bytes(key, b"")
    paged.put_bytes("q/outside", b"")
    calls: list[Any] = []
    paged._client.meta.events.register("after-call.s3.ListObjectsV2", lambda **kw: calls.append(1))
    assert list(paged.list_keys("p/")) == keys
    assert len(calls) == 4


def test_get_verified_checks_the_digest(store: ObjectStore) -> None:
    ref = store.put_bytes("shared/log.txt", b"visible")
    assert store.get_verified(ref) == b"visible"
    store.put_bytes("shared/log.txt", b"changed")
    with pytest.raises(DigestMismatch, match="does not match its sha256"):
        store.get_verified(ref)


def test_unreachable_endpoint_is_transient(seaweed: SeaweedServer) -> None:
    s3_port, _ = pick_free_ports()
    endpoint = f"http://127.0.0.1:{s3_port}"
    store = ObjectStore(seaweed.settings.model_copy(update={"endpoint": endpoint}))
    with pytest.raises(TransientStorageError) as err:
        store.check()
    assert str(err.value) == f"cannot reach S3 at {endpoint}: connection refused"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"secret_key": SecretStr("wrong")},
            "rejected the credentials for access key 'test-key' (wrong secret key)",
        ),
        (
            {"access_key": "nobody"},
            "rejected the credentials for access key 'nobody' (unknown access key)",
        ),
    ],
)
def test_wrong_credentials_are_permanent(
    seaweed: SeaweedServer, store: ObjectStore, change: dict[str, Any], message: str
) -> None:
    bad = ObjectStore(seaweed.settings.model_copy(update=change), store.bucket)
    with pytest.raises(PermanentStorageError) as err:
        bad.check()
    assert str(err.value) == f"S3 at {seaweed.endpoint} {message}"


def test_missing_bucket_is_permanent_and_never_autocreated(seaweed: SeaweedServer) -> None:
    missing = ObjectStore(seaweed.settings, "never-created")
    expected = f"bucket 'never-created' does not exist at {seaweed.endpoint}: run `tempered up` or create it"
    for attempt in (missing.check, lambda: missing.put_bytes("k", b"v")):
        with pytest.raises(PermanentStorageError) as err:
            attempt()
        assert str(err.value) == expected


def test_bad_endpoint_url_is_permanent(seaweed: SeaweedServer) -> None:
    with pytest.raises(PermanentStorageError, match="bad S3 endpoint URL 'localhost-8333'"):
        ObjectStore(seaweed.settings.model_copy(update={"endpoint": "localhost-8333"}))


def test_store_recovers_after_restart(seaweed: SeaweedServer, store: ObjectStore) -> None:
    store.put_bytes("durable", b"kept")
    seaweed.stop()
    try:
        with pytest.raises(TransientStorageError, match="connection refused"):
            store.get_bytes("durable")
    finally:
        seaweed.start()
    assert store.get_bytes("durable") == b"kept"
    store.put_bytes("after", b"new", create_only=True)
    assert store.exists("after")


def test_store_that_ignores_if_none_match_is_refused(store: ObjectStore) -> None:
    check_create_only(store)  # SeaweedFS enforces conditional writes
    assert not list(store.list_keys(PROBE_PREFIX)), "the probe cleans up after itself"

    def drop_condition(params: dict[str, Any], **_: Any) -> None:
        params.pop("IfNoneMatch", None)  # as a store that ignores the header would behave

    store._client.meta.events.register("provide-client-params.s3.PutObject", drop_condition)
    with pytest.raises(PermanentStorageError, match="ignores If-None-Match") as err:
        check_create_only(store)
    assert str(err.value).count("\n") == 0
