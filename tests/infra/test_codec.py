"""The UI's codec server (infra/codec.py) over HTTP, on a real S3: references resolved for
display, capped, digest-checked, read-only, and only for the UI's origin."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from infra import codec
from infra.storage import ObjectStore

UI = "http://127.0.0.1:8233"
PROGRAM = "def add(a, b):\n    return a - b\n"
TRACEBACK = 'Traceback (most recent call last):\n  File "program.py", line 2\nAssertionError\n'


class ReadOnlyStore(ObjectStore):
    """The test's store with every write refused: the codec must never need one."""

    def put_bytes(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the codec server wrote to the store")

    def delete(self, key: str) -> None:
        raise AssertionError("the codec server deleted from the store")

    def upload_file(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the codec server wrote to the store")


def payload(value: Any, encoding: str = "json/plain") -> dict[str, Any]:
    return {
        "metadata": {"encoding": base64.b64encode(encoding.encode()).decode()},
        "data": base64.b64encode(json.dumps(value).encode()).decode(),
    }


def value_of(decoded: dict[str, Any]) -> Any:
    return json.loads(base64.b64decode(decoded["data"]))


@pytest_asyncio.fixture
async def client(store: ObjectStore) -> AsyncIterator[TestClient[Any, Any]]:
    read_only = ReadOnlyStore(store.settings, store.bucket)
    async with TestClient(TestServer(codec.create_app(read_only, [UI]))) as test_client:
        yield test_client


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
    assert rest[-1]["content"] == codec.OVER_LIMIT  # one reference more than a request may read
    assert len(decoded["shown"]) <= codec.MAX_SHOWN_LINES


@pytest.mark.asyncio
async def test_a_changed_object_is_not_shown_as_the_referenced_one(
    client: TestClient[Any, Any], store: ObjectStore
) -> None:
    ref = store.put_text("runs/r/code.py", PROGRAM)
    store.put_text(ref.key, "something else")
    (decoded,) = await decode(client, {"code": ref.model_dump()})
    assert "content" not in decoded["code"] and "sha256" in decoded["code"]["content_error"]


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
    assert bad.status == 400
