"""What the UI's codec server (infra/codec.py) answers and logs: `/encode` undoes `/decode`,
forged references all get one line and cost the log one line per request, and a reply's size
is bounded by MAX_BYTES whatever the objects hold."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from temporalio.contrib.pydantic import pydantic_data_converter

from contracts.task import AgentTaskInput
from infra import codec
from infra.storage import ObjectStore
from tests.infra.test_codec import UI, client, decode, payload, refs_in, value_of

__all__ = ["client"]  # the fixture, for this file's tests


async def post(client: TestClient[Any, Any], path: str, payloads: list[Any]) -> list[Any]:
    response = await client.post(path, json={"payloads": payloads}, headers={"Origin": UI})
    assert response.status == 200, await response.text()
    return list((await response.json())["payloads"])


def as_the_sdk_sends(value: Any) -> dict[str, Any]:
    """`value` as Tempered's data converter writes it into a history (base64 as in JSON)."""
    (sent,) = pydantic_data_converter.payload_converter.to_payloads([value])
    return {
        "metadata": {name: base64.b64encode(v).decode() for name, v in sent.metadata.items()},
        "data": base64.b64encode(sent.data).decode(),
    }


def as_the_ui_sends(decoded: dict[str, Any]) -> dict[str, Any]:
    """A decoded payload as the UI's start form sends it back: its JSON re-stringified (as
    `JSON.stringify` writes it), its metadata new."""
    text = json.dumps(value_of(decoded), separators=(",", ":"), ensure_ascii=False)
    return payload_of(text.encode())


def payload_of(data: bytes) -> dict[str, Any]:
    return {
        "metadata": {"encoding": base64.b64encode(b"json/plain").decode()},
        "data": base64.b64encode(data).decode(),
    }


@pytest.mark.asyncio
async def test_encode_gives_back_what_decode_was_given(
    client: TestClient[Any, Any], store: ObjectStore
) -> None:
    """The UI's "Start Workflow Like This One" fills its form with the decoded input and
    sends it to /encode: the new workflow must get the original input, not the display."""
    files = store.put_bytes("tasks/w/files.z", b"\x78\x9c" + b"tree" * 10)
    verifier = store.put_bytes("tasks/w/verifier.z", b"\x78\x9c" + b"tests" * 10)
    task = {"id": "w1", "prompt": "fix it", "env": "workspace"}
    workspace = {"files": files.model_dump(), "verifier": verifier.model_dump()}
    started = AgentTaskInput.model_validate({"task": {**task, "workspace": workspace}})
    missing = {**files.model_dump(), "key": "tasks/w/gone.z"}  # decoded with an error only
    looks_decoded = {"shown": ["mine"], "payload": {"code": files.model_dump()}}
    originals = [
        as_the_sdk_sends(started),
        as_the_sdk_sends({"code": missing, "ratio": 1e-7, "text": "é\x01"}),
        as_the_sdk_sends(looks_decoded),
        payload({"plain": 1}),  # no reference: /decode leaves it as it is
        payload(None, "binary/null"),
    ]
    decoded = await post(client, "/decode", originals)
    assert value_of(decoded[0])["shown"] and decoded[3:] == originals[3:]
    assert await post(client, "/encode", decoded) == originals  # byte for byte
    assert await post(client, "/encode", originals[2:]) == originals[2:]  # nothing added
    restarted = await post(client, "/encode", [as_the_ui_sends(decoded[0])])
    assert AgentTaskInput.model_validate(value_of(restarted[0])) == started


@pytest.mark.asyncio
async def test_forged_references_get_one_reply(
    client: TestClient[Any, Any], store: ObjectStore
) -> None:
    """Whether a guessed key exists, or how big it is, is not for whoever asks: a reference
    that names no stored object exactly gets the same line, whatever the reason."""
    present = store.put_text("runs/other/policy/notes.txt", "z" * 10)
    empty = store.put_text("runs/other/s0/stdout.txt", "")  # no byte 0 to range over
    store._client.put_object(  # written by something else: no sha256 metadata
        Bucket=store.bucket, Key="runs/other/raw.bin", Body=b"q" * 100_000
    )
    fake = "0" * 64
    refs = [
        {"key": present.key, "size": 1, "sha256": fake},  # there, not that size
        {"key": present.key, "size": present.size, "sha256": fake},  # there, not that digest
        {"key": "runs/other/policy/absent.txt", "size": 1, "sha256": fake},  # not there
        {"key": "runs/other/raw.bin", "size": 99_999, "sha256": fake},
        {"key": "runs/other/raw.bin", "size": 100_000, "sha256": fake},  # the size, a part
        {"key": empty.key, "size": 5, "sha256": fake},  # there, empty
        {"key": empty.key, "size": 10**9, "sha256": fake},  # there, empty: a part claimed
    ]
    (decoded,) = await decode(client, {"refs": refs})
    replies = {
        json.dumps({k: v for k, v in r.items() if k not in refs[0]}) for r in refs_in(decoded)
    }
    assert len(replies) == 1, replies


@pytest.mark.asyncio
async def test_forged_references_cost_the_log_one_short_line(
    client: TestClient[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """Keys of 20 KB that S3 refuses or does not find: the log gets a line per request, not
    the keys (a 6.8 MB request once wrote 10 MB of log)."""
    long = "k" * 20_000
    refs = [
        {"key": f"{prefix}{long}{i}", "size": 1, "sha256": "0" * 64}
        for i in range(16)
        for prefix in ("runs/", "../x/")
    ]
    with caplog.at_level(logging.INFO, "tempered.codec"):
        (decoded,) = await decode(client, {"refs": refs})
    assert all("content_error" in r for r in refs_in(decoded))
    lines = [r.getMessage() for r in caplog.records if r.name == "tempered.codec"]
    assert len(lines) == 1 and len(lines[0]) < 2000, [len(line) for line in lines]
    assert lines[0].startswith("32 references not shown") and "\n" not in lines[0]


@pytest.mark.asyncio
async def test_a_reply_is_bounded_by_max_bytes_as_sent(
    client: TestClient[Any, Any], store: ObjectStore
) -> None:
    """Control bytes grow sixfold as JSON (`\\u0001`), each text is sent twice (`content` and
    `shown`) and base64 adds a third: 2.7 KB of references once got a 16 MB reply."""
    text = "\x02" + "\x01" * (codec.MAX_OBJECT_BYTES - 1)
    refs = [
        store.put_text(f"runs/r/control-{i}.txt", chr(i + 2) + text[1:]).model_dump()
        for i in range(16)
    ]
    body = json.dumps({"payloads": [payload({"refs": refs})]})
    response = await client.post(
        "/decode", data=body, headers={"Origin": UI, "Content-Type": "application/json"}
    )
    reply = await response.read()
    assert len(reply) <= 4 / 3 * (codec.MAX_BYTES + 2 * len(body)), len(reply)
    (decoded,) = [value_of(p) for p in json.loads(reply)["payloads"]]
    shown = refs_in(decoded)
    assert shown[0]["content"] == text and shown[-1]["content_error"] == codec.OVER_BYTES
