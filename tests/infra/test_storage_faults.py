"""ObjectStore under faults: conditional-write conflicts, broken downloads, folder markers.

Against the real SeaweedFS of the `store` fixture, except where a real server cannot produce the
fault (an S3 409 ConditionalRequestConflict): there a botocore Stubber on the real client.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from infra.storage import ObjectExists, ObjectStore, PermanentStorageError, TransientStorageError
from infra.storage_errors import classify_client_error
from tests.fixtures.s3 import SeaweedServer


class TruncatingProxy:
    """A TCP proxy to SeaweedFS that cuts every connection after `limit` bytes of replies: a
    response body broken mid-stream, as a flaky network or a restarting load balancer does."""

    def __init__(self, upstream_port: int, limit: int):
        self.upstream_port = upstream_port
        self.limit = limit
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            for src, dst, limit in ((client, upstream, None), (upstream, client, self.limit)):
                threading.Thread(target=self._pipe, args=(src, dst, limit), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, limit: int | None) -> None:
        sent = 0
        with contextlib.suppress(OSError):
            while (limit is None or sent < limit) and (data := src.recv(65536)):
                data = data if limit is None else data[: limit - sent]
                dst.sendall(data)
                sent += len(data)
        for sock in (src, dst):  # shutdown wakes the other direction's blocked recv
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@pytest.fixture
def truncating_store(seaweed: SeaweedServer, store: ObjectStore) -> Iterator[ObjectStore]:
    """`store`'s bucket, reached through a proxy that breaks replies after 4 KiB."""
    proxy = TruncatingProxy(seaweed.s3_port, limit=4096)
    try:
        yield ObjectStore(
            seaweed.settings.model_copy(update={"endpoint": proxy.endpoint}), store.bucket
        )
    finally:
        proxy.close()


def _client_error(code: str, status: int) -> ClientError:
    response: Any = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return ClientError(response, "PutObject")


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("PreconditionFailed", 412, ObjectExists),
        ("412", 412, ObjectExists),  # HEAD-style reply without a body
        ("ConditionalRequestConflict", 409, TransientStorageError),
        ("OperationAborted", 409, TransientStorageError),
        ("BucketNotEmpty", 409, PermanentStorageError),
    ],
)
def test_only_a_failed_precondition_means_the_object_exists(
    code: str, status: int, expected: type[Exception]
) -> None:
    """Pure classification of a ClientError, no request made."""
    error = classify_client_error(_client_error(code, status), "put", "k", "http://s3", "b", "ak")
    assert type(error) is expected


@pytest.mark.parametrize(
    ("code", "status", "expected", "says"),
    [
        # some S3 servers do not implement If-None-Match: retrying it never helps
        ("NotImplemented", 501, PermanentStorageError, "conditional writes"),
        # a 403 that is no refusal of the credentials: the clock is off
        ("RequestTimeTooSkewed", 403, TransientStorageError, "clock"),
        # a 404 that is no missing object: the upload was aborted or expired meanwhile
        ("NoSuchUpload", 404, TransientStorageError, "multipart upload"),
        # the request's body was cut short on the way: the network's fault
        ("IncompleteBody", 400, TransientStorageError, "IncompleteBody"),
    ],
)
def test_codes_are_classified_before_the_status_catch_alls(
    code: str, status: int, expected: type[Exception], says: str
) -> None:
    error = classify_client_error(_client_error(code, status), "put", "k", "http://s3", "b", "ak")
    assert type(error) is expected, error
    assert says in str(error) and "access key" not in str(error)


def test_conditional_request_conflict_is_transient(store: ObjectStore) -> None:
    """S3 answers 409 ConditionalRequestConflict to concurrent conditional writes of one key
    (AWS: retry). SeaweedFS never sends it, so a botocore Stubber on the real client does; the
    Stubber holds no HEAD reply, so a put that took the 409 for ObjectExists would fail on one."""
    with Stubber(store._client) as stub:
        stub.add_client_error(
            "put_object", service_error_code="ConditionalRequestConflict", http_status_code=409
        )
        with pytest.raises(
            TransientStorageError, match="failed put on .*ConditionalRequestConflict"
        ):
            store.put_bytes("contended", b"mine", create_only=True)
        stub.assert_no_pending_responses()


def test_refused_create_with_nothing_stored_is_transient(
    seaweed: SeaweedServer, store: ObjectStore
) -> None:
    """SeaweedFS really refuses the write (412); another client deletes the key before the HEAD
    that follows, as when the winning writer's object is not visible yet."""
    store.put_bytes("k", b"first", create_only=True)
    other = ObjectStore(seaweed.settings, store.bucket)
    store._client.meta.events.register("before-call.s3.HeadObject", lambda **_: other.delete("k"))
    with pytest.raises(TransientStorageError, match="create-only write refused"):
        store.put_bytes("k", b"second", create_only=True)


def test_download_broken_mid_body_is_transient(
    store: ObjectStore, truncating_store: ObjectStore, tmp_path: Path
) -> None:
    """Every GET's body is cut by the proxy: s3transfer retries, then raises boto3's
    RetriesExceededError (no BotoCoreError), which must come out typed."""
    store.put_bytes("ckpt/shard.bin", b"x" * 65536)
    target = tmp_path / "shard.bin"
    with pytest.raises(TransientStorageError, match="failed download on .*ckpt/shard.bin"):
        truncating_store.download_file("ckpt/shard.bin", target)
    assert not target.exists()


def test_download_dir_skips_folder_markers(store: ObjectStore, tmp_path: Path) -> None:
    """Empty keys ending in "/" are what a console's "create folder" writes; SeaweedFS lists them."""
    for marker in ("runs/r/v1/", "runs/r/v1/sub/"):
        store._client.put_object(Bucket=store.bucket, Key=marker, Body=b"")
    store.put_bytes("runs/r/v1/sub/weights.bin", b"w")
    store.put_bytes("runs/r/v1/config.json", b"{}")
    assert "runs/r/v1/sub/" in list(store.list_keys("runs/r/v1/"))
    written = store.download_dir("runs/r/v1", tmp_path / "dst")
    assert sorted(p.relative_to(tmp_path / "dst").as_posix() for p in written) == [
        "config.json",
        "sub/weights.bin",
    ]
    assert (tmp_path / "dst" / "sub" / "weights.bin").read_bytes() == b"w"
