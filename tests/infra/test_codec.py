"""The UI's codec server (infra/codec.py) over HTTP, on a real S3: references resolved for
display, capped, digest-checked, read-only, and only for the UI's origin."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from pydantic import SecretStr

from contracts.common import ObjectRef
from infra import codec, codec_reader, codec_shown
from infra.settings import S3Settings
from infra.storage import ObjectStore

UI = "http://127.0.0.1:8233"
PROGRAM = "def add(a, b):\n    return a - b\n"
TRACEBACK = 'Traceback (most recent call last):\n  File "program.py", line 2\nAssertionError\n'


def listing(store: ObjectStore) -> dict[str, tuple[Any, ...]]:
    """Every object of the store's bucket, as S3 lists it (its ETag, size, time)."""
    pages = store._client.get_paginator("list_objects_v2").paginate(Bucket=store.bucket)
    objects = (o for page in pages for o in page.get("Contents", []))
    return {o["Key"]: (o["ETag"], o["Size"], o["LastModified"]) for o in objects}


def watched_app(store: ObjectStore) -> tuple[web.Application, list[str]]:
    """The codec's app for `store`, and the keys any of its requests changed (the bucket listed
    before and after each, whatever client wrote): the codec must never write."""
    writes: list[str] = []

    @web.middleware
    async def watch(request: web.Request, handler: Any) -> web.StreamResponse:
        before = await asyncio.to_thread(listing, store)
        try:
            return await handler(request)
        finally:
            after = await asyncio.to_thread(listing, store)
            writes.extend(
                k for k in sorted(before.keys() | after.keys()) if before.get(k) != after.get(k)
            )

    app = codec.create_app(store, [UI])
    app.middlewares.append(watch)  # innermost: the requests the app answers, not those refused
    return app, writes


def payload(value: Any, encoding: str = "json/plain") -> dict[str, Any]:
    return {
        "metadata": {"encoding": base64.b64encode(encoding.encode()).decode()},
        "data": base64.b64encode(json.dumps(value).encode()).decode(),
    }


def value_of(decoded: dict[str, Any]) -> Any:
    return json.loads(base64.b64decode(decoded["data"]))


@pytest_asyncio.fixture
async def client(store: ObjectStore) -> AsyncIterator[TestClient[Any, Any]]:
    app, writes = watched_app(store)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client
    assert writes == [], "the codec server wrote to the store"


async def decode(client: TestClient[Any, Any], *values: Any) -> list[Any]:
    response = await client.post(
        "/decode", json={"payloads": [payload(v) for v in values]}, headers={"Origin": UI}
    )
    assert response.status == 200, await response.text()
    assert response.headers["Access-Control-Allow-Origin"] == UI
    return [value_of(p) for p in (await response.json())["payloads"]]


@pytest.mark.asyncio
async def test_references_resolved_and_their_texts_shown_first(
    client: TestClient[Any, Any], store: ObjectStore
) -> None:
    code = store.put_text("runs/r/tasks/t/s0/turn-0/code.py", PROGRAM)
    result = store.put_json(
        "runs/r/tasks/t/s0/turn-0/attempt-1/result.json",
        {"status": "failed", "stderr": TRACEBACK, "token_ids": list(range(100))},
    )
    response = {
        "outcomes": [{"sample": 0, "code": code.model_dump(), "result": result.model_dump()}]
    }
    (decoded,) = await decode(client, response)
    outcome = decoded["payload"]["outcomes"][0]
    assert outcome["code"]["content"] == PROGRAM and outcome["code"]["key"] == code.key
    assert outcome["result"]["content"]["stderr"] == TRACEBACK
    assert outcome["result"]["content"]["token_ids"] == "(100 numbers)"
    shown = decoded["shown"]
    assert shown[0] == "── turn-0/code.py ──" and shown[1:3] == PROGRAM.splitlines()
    assert shown[3:5] == [
        '── attempt-1/result.json: status "failed" ──',
        "── attempt-1/result.json stderr ──",
    ]
    assert "AssertionError" in shown


@pytest.mark.asyncio
async def test_what_it_returns_is_capped(client: TestClient[Any, Any], store: ObjectStore) -> None:
    big = store.put_text("runs/r/big.txt", "x" * (codec.MAX_OBJECT_BYTES * 2))
    small = store.put_text("runs/r/small.txt", "y")
    refs = [big.model_dump()] + [small.model_dump()] * codec.MAX_REFS
    (decoded,) = await decode(client, {"refs": refs})
    first, *rest = decoded["payload"]["refs"]
    assert first["content_truncated"] and len(first["content"]) == codec.MAX_OBJECT_BYTES
    assert [r["content"] for r in rest[:-1]] == ["y"] * (codec.MAX_REFS - 1)
    # one reference more than a request may read
    assert rest[-1]["content_error"] == codec.OVER_REFS
    assert len(decoded["shown"]) <= codec_shown.MAX_SHOWN_LINES


@pytest.mark.asyncio
async def test_a_changed_object_is_not_shown_as_the_referenced_one(
    client: TestClient[Any, Any], store: ObjectStore
) -> None:
    ref = store.put_text("runs/r/code.py", PROGRAM)
    store.put_text(ref.key, "something else")
    (decoded,) = await decode(client, {"code": ref.model_dump()})
    code = decoded["payload"]["code"]
    assert "content" not in code and code["content_error"] == codec_reader.NO_MATCH


@pytest.mark.asyncio
async def test_other_payloads_and_encode_pass_through(client: TestClient[Any, Any]) -> None:
    raw = [payload(None, "binary/null"), payload({"plain": 1})]
    for path in ("/decode", "/encode"):
        response = await client.post(path, json={"payloads": raw}, headers={"Origin": UI})
        assert (await response.json())["payloads"] == raw


@pytest.mark.asyncio
async def test_only_the_ui_origin_is_answered(client: TestClient[Any, Any]) -> None:
    body = {"payloads": [payload({"a": 1})]}
    for headers in ({}, {"Origin": "http://evil.example"}, {"Origin": "http://127.0.0.1:9999"}):
        response = await client.post("/decode", json=body, headers=headers)
        assert response.status == 403 and "Access-Control-Allow-Origin" not in response.headers
    preflight = await client.options(
        "/decode",
        headers={
            "Origin": UI,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,x-namespace",
        },
    )
    assert preflight.status == 204
    assert preflight.headers["Access-Control-Allow-Origin"] == UI
    assert "x-namespace" in preflight.headers["Access-Control-Allow-Headers"]
    bad = await client.post("/decode", data=b"not json", headers={"Origin": UI})
    assert bad.status == 400  # with CORS headers, or the browser reports a CORS error instead
    assert bad.headers["Access-Control-Allow-Origin"] == UI


@contextmanager
def silent_s3() -> Iterator[ObjectStore]:
    """A store whose S3 accepts connections and never answers them."""
    with socket.socket() as hole:
        hole.bind(("127.0.0.1", 0))
        hole.listen(1024)  # the kernel completes connections; nothing ever answers them
        s3 = S3Settings(endpoint=f"http://127.0.0.1:{hole.getsockname()[1]}", bucket="tempered")
        yield ObjectStore(s3)


def refs_in(decoded: Any) -> list[dict[str, Any]]:
    return list(decoded["payload"]["refs"] if "shown" in decoded else decoded["refs"])


@pytest.mark.asyncio
async def test_a_key_alone_reads_nothing(client: TestClient[Any, Any], store: ObjectStore) -> None:
    """Any program can send the UI's Origin: a reference must name the stored object (size and
    sha256), or a key of another run (a policy, hidden tests) would be read for whoever asks."""
    secret = "SECRET of another run\n" * codec.MAX_OBJECT_BYTES
    ref = store.put_text("runs/other/tasks/t/s0/turn-0/code.py", secret)
    store._client.put_object(  # written by something else: no sha256 metadata
        Bucket=store.bucket, Key="runs/other/notes.txt", Body=secret.encode()
    )
    fake = "0" * 64
    guesses = [
        {"key": ref.key, "size": 10**9, "sha256": fake},  # the size past the limit: a part
        {"key": ref.key, "size": ref.size, "sha256": fake},
        {"key": ref.key, "size": 3, "sha256": fake},
        {"key": "runs/other/notes.txt", "size": ref.size, "sha256": ref.sha256},
    ]
    (decoded,) = await decode(client, {"refs": guesses})
    assert "SECRET" not in json.dumps(decoded)
    assert [r["content_error"] for r in refs_in(decoded)] == [codec_reader.NO_MATCH] * 4
    (shown,) = await decode(client, {"refs": [ref.model_dump()]})  # the real reference: shown
    assert refs_in(shown)[0]["content"].startswith("SECRET")


@pytest.mark.asyncio
async def test_what_a_reference_claims_does_not_size_the_read(
    client: TestClient[Any, Any], store: ObjectStore
) -> None:
    """A reference claiming 5 bytes of a 16 MiB object (a policy blob) must not read 16 MiB into
    the server's memory, nor references that find nothing go past MAX_REFS reads."""
    big = store.put_bytes("runs/r/policy/blobs/big", b"w" * (16 * 1024 * 1024))
    claim = {"key": big.key, "size": 5, "sha256": "0" * 64}
    tracemalloc.start()
    try:
        (decoded,) = await decode(client, {"refs": [claim]})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, f"{peak} bytes at the peak"
    assert refs_in(decoded)[0]["content_error"] == codec_reader.NO_MATCH
    missing = [{"key": f"runs/r/none-{i}", "size": 1, "sha256": "0" * 64} for i in range(300)]
    (decoded,) = await decode(client, {"refs": missing})
    tried, skipped = refs_in(decoded)[: codec.MAX_REFS], refs_in(decoded)[codec.MAX_REFS :]
    assert [r.get("content_error") for r in skipped] == [codec.OVER_REFS] * (300 - codec.MAX_REFS)
    assert [r["content_error"] for r in tried] == [codec_reader.NO_MATCH] * codec.MAX_REFS


@pytest.mark.asyncio
async def test_s3_that_does_not_answer_does_not_hang_the_ui() -> None:
    """S3 accepting connections and never answering: the UI gets its answer in seconds (each
    reference says so), not after 60 s × 3 attempts per reference."""
    with silent_s3() as silent:
        app = codec.create_app(silent, [UI])
        async with TestClient(TestServer(app)) as hung:
            refs = [{"key": f"runs/r/{i}.txt", "size": 1, "sha256": "0" * 64} for i in range(5)]
            started = time.monotonic()
            (decoded,) = await asyncio.wait_for(decode(hung, {"refs": refs}), 30)
    assert time.monotonic() - started < codec.MAX_SECONDS + 5
    assert [r["content_error"] for r in refs_in(decoded)] == [codec_reader.UNAVAILABLE] * 5


@pytest.mark.asyncio
async def test_many_requests_to_an_s3_that_does_not_answer_wait_about_one_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The UI sends a /decode per event at once: against an S3 that never answers, all are
    answered within about one read's time (its silence is remembered across requests), not one
    pool of threads' worth after another; /encode, which reads nothing, meanwhile at once."""
    monkeypatch.setattr(codec_reader, "READ_TIMEOUT_S", 1.0)  # one read: 2 attempts, ~2-3 s
    one_read = 2 * codec_reader.READ_TIMEOUT_S + 1.0  # and at most 1 s of backoff between
    with silent_s3() as silent:
        async with TestClient(TestServer(codec.create_app(silent, [UI]))) as hung:
            started = time.monotonic()
            decodes = [
                asyncio.create_task(
                    decode(hung, {"ref": {"key": f"runs/r/{i}.txt", "size": 1, "sha256": "0" * 64}})
                )
                for i in range(96)  # more than any default pool's threads, twice
            ]
            await asyncio.sleep(0.5)  # the reads are under way
            encoding = time.monotonic()
            encoded = await hung.post(
                "/encode", json={"payloads": [payload({"a": 1})]}, headers={"Origin": UI}
            )
            encode_took = time.monotonic() - encoding
            decoded = await asyncio.wait_for(asyncio.gather(*decodes), 120)
            took = time.monotonic() - started
    assert took < one_read + 2.0, f"96 requests took {took:.1f} s"
    assert encoded.status == 200 and encode_took < 1.0, f"/encode took {encode_took:.1f} s"
    assert {d["payload"]["ref"]["content_error"] for (d,) in decoded} == {codec_reader.UNAVAILABLE}


def test_an_s3_that_did_not_answer_is_not_asked_again_for_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(codec_reader, "READ_TIMEOUT_S", 0.2)
    monkeypatch.setattr(codec_reader, "SILENT_S", 1.0)
    ref = ObjectRef(key="runs/r/x.txt", size=1, sha256="0" * 64)
    with silent_s3() as silent:
        reader = codec_reader.Reader(silent)
        with pytest.raises(codec_reader.S3Unavailable) as first:
            reader.read(ref, 1)
        asked = time.monotonic()
        with pytest.raises(codec_reader.S3Unavailable) as again:
            reader.read(ref, 1)
        assert time.monotonic() - asked < 0.1 and "not tried" in again.value.detail
        time.sleep(1.0)  # `SILENT_S` later: asked again
        with pytest.raises(codec_reader.S3Unavailable) as later:
            reader.read(ref, 1)
    assert "not tried" not in first.value.detail + later.value.detail


@pytest.mark.asyncio
async def test_failures_name_no_endpoint_bucket_or_credentials(store: ObjectStore) -> None:
    ref = store.put_text("runs/r/code.py", PROGRAM)
    settings = store.settings
    wrong_secret = settings.model_copy(update={"secret_key": SecretStr("not-the-secret")})
    closed = settings.model_copy(update={"endpoint": "http://127.0.0.1:1"})
    for s3 in (wrong_secret, closed):
        app = codec.create_app(ObjectStore(s3, store.bucket), [UI])
        async with TestClient(TestServer(app)) as other:
            (decoded,) = await decode(other, {"refs": [ref.model_dump()]})
        for secret in (settings.endpoint, s3.endpoint, store.bucket, settings.access_key):
            assert str(secret) not in json.dumps(decoded), decoded
        assert refs_in(decoded)[0]["content_error"] in (
            codec_reader.REFUSED,
            codec_reader.UNAVAILABLE,
        )


@pytest.mark.asyncio
async def test_a_payload_it_cannot_take_fails_alone(
    client: TestClient[Any, Any], store: ObjectStore
) -> None:
    """A payload nested too deeply, or malformed, comes back unchanged; the request's others
    are still decoded (not a 500 that leaves the UI with none)."""
    ref = store.put_text("runs/r/code.py", PROGRAM)
    deep = {
        "metadata": payload(None)["metadata"],
        "data": base64.b64encode(b"[" * 100_000 + b"]" * 100_000).decode(),
    }
    odd = {"metadata": "not a map", "data": 7}
    response = await client.post(
        "/decode",
        json={"payloads": [deep, odd, payload({"refs": [ref.model_dump()]})]},
        headers={"Origin": UI},
    )
    assert response.status == 200, await response.text()
    first, second, third = (await response.json())["payloads"]
    assert (first, second) == (deep, odd)
    assert refs_in(value_of(third))[0]["content"] == PROGRAM


def test_its_client_sends_nothing_but_reads(store: ObjectStore) -> None:
    reader = codec_reader.Reader(store)
    with pytest.raises(RuntimeError, match="does not PutObject"):
        reader.client.put_object(Bucket=store.bucket, Key="runs/r/x", Body=b"x")
    assert not store.exists("runs/r/x")


@pytest.mark.asyncio
async def test_an_empty_object_is_shown_empty(
    client: TestClient[Any, Any], store: ObjectStore
) -> None:
    """No byte 0 to range over: read whole (an empty stdout.txt is common)."""
    empty = store.put_text("runs/r/tasks/t/s0/turn-0/attempt-1/stdout.txt", "")
    (decoded,) = await decode(client, {"refs": [empty.model_dump()]})
    assert refs_in(decoded)[0]["content"] == ""
