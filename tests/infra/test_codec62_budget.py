"""The codec server's budget of one request (infra/codec.py): a document whose inner references
fill it is still shown (its status, reward, completion), only the inner references that do not
fit say so; a request's `MAX_SECONDS` start once it has a read thread, not while it waits for
one; and what the budget refuses is a `content_error`, one line for each limit (time, bytes,
references). On a real SeaweedFS; a slow S3 is that server behind a proxy that delays each
request."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from infra import codec, codec_resolver
from infra.codec_reader import Reader
from infra.storage import ObjectStore

UI = "http://127.0.0.1:8233"


def payload(value: Any) -> dict[str, Any]:
    return {
        "metadata": {"encoding": base64.b64encode(b"json/plain").decode()},
        "data": base64.b64encode(json.dumps(value).encode()).decode(),
    }


def value_of(decoded: dict[str, Any]) -> Any:
    return json.loads(base64.b64decode(decoded["data"]))


def refusals() -> set[str]:
    return {codec.OVER_TIME, codec.OVER_BYTES, codec.OVER_REFS}


def test_a_document_whose_inner_references_fill_the_budget_is_shown(store: ObjectStore) -> None:
    """A trajectory with a 200-line completion and 40 logs of 130 KB: it was replaced whole by
    "(not shown: over the codec server's limit …)", its status and reward dropped, because it
    reserved its own bytes but not the `shown` lines it had added."""
    logs = [
        store.put_text(f"runs/r/t/turn-{i}/stdout.txt", f"log line {i} " * 12000) for i in range(40)
    ]
    completion = "def f():\n" + "    x = 1\n" * 200
    document = {
        "status": "ok",
        "reward": 1.0,
        "completion": completion,
        "turns": [{"stdout": log.model_dump()} for log in logs],
    }
    ref = store.put_json("runs/r/t/trajectory.json", document)
    (out,) = codec.decode_payloads(Reader(store), [payload({"trajectory": ref.model_dump()})])
    decoded = value_of(out)
    trajectory = decoded["payload"]["trajectory"]
    content = trajectory.get("content")
    assert isinstance(content, dict), (str(content)[:120], trajectory.get("content_error"))
    assert content["status"] == "ok" and content["reward"] == 1.0
    assert content["completion"] == completion
    assert decoded["shown"][0] == '── t/trajectory.json: status "ok", reward 1.0 ──'
    turns = [turn["stdout"] for turn in content["turns"]]
    shown = [turn for turn in turns if "content" in turn]
    refused = [turn for turn in turns if "content" not in turn]
    assert shown and refused, "some logs fit in the request's bytes, the later ones do not"
    assert all(turn["content_error"] == codec.OVER_BYTES for turn in refused)
    assert all(turn["content"] not in refusals() for turn in shown)
    # what the request adds is still within its bytes (and a line on each reference)
    added = len(base64.b64decode(out["data"])) - len(json.dumps(document))
    assert added <= codec.MAX_BYTES + 200 * len(refused)


@contextmanager
def slow_s3(endpoint: str, delay_s: float) -> Iterator[str]:
    """`endpoint` (a real S3) behind a proxy that holds each request `delay_s` before passing
    it on; yields the proxy's endpoint."""
    host, port = endpoint.removeprefix("http://").rsplit(":", 1)
    server, stop = socket.create_server(("127.0.0.1", 0)), threading.Event()
    server.settimeout(0.1)

    def pipe(source: socket.socket, sink: socket.socket, delay: float) -> None:
        try:
            while chunk := source.recv(65536):
                time.sleep(delay)
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                end.close()

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            upstream = socket.create_connection((host, int(port)))
            threading.Thread(target=pipe, args=(client, upstream, delay_s), daemon=True).start()
            threading.Thread(target=pipe, args=(upstream, client, 0.0), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        server.close()


@pytest.mark.asyncio
async def test_a_request_s_time_starts_when_it_has_a_read_thread(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """48 requests at once on an S3 that takes 0.2 s a read, 3 references each: 8 threads take
    6 rounds of 0.6 s. The later requests spent their `MAX_SECONDS` (2 s here) waiting for a
    thread, and every reference of theirs was "over the limit", none of it read."""
    monkeypatch.setattr(codec_resolver, "MAX_SECONDS", 2.0)
    refs = [
        store.put_text(f"runs/r/t/s{i}/code.py", f"print({i})\n").model_dump() for i in range(3)
    ]
    with slow_s3(str(store.settings.endpoint), 0.2) as proxy:
        slow = ObjectStore(store.settings.model_copy(update={"endpoint": proxy}), store.bucket)
        async with TestClient(TestServer(codec.create_app(slow, [UI]))) as client:

            async def one() -> list[dict[str, Any]]:
                body = {"payloads": [payload({"refs": refs})]}
                response = await client.post("/decode", json=body, headers={"Origin": UI})
                assert response.status == 200
                (decoded,) = (await response.json())["payloads"]
                return list(value_of(decoded)["payload"]["refs"])

            started = time.monotonic()
            replies = await asyncio.gather(*(one() for _ in range(48)))
            took = time.monotonic() - started
    contents = [[r.get("content", r.get("content_error")) for r in reply] for reply in replies]
    assert contents == [["print(0)\n", "print(1)\n", "print(2)\n"]] * 48
    assert took > 2.0 * 1.5, f"the requests queued for threads ({took:.1f} s in all)"


@pytest.mark.asyncio
async def test_budget_refusals_are_content_errors_naming_their_limit(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    code = store.put_text("runs/r/code.py", "print(1)\n").model_dump()
    app = codec.create_app(store, [UI])
    async with TestClient(TestServer(app)) as client:

        async def refs_of(refs: list[dict[str, Any]]) -> list[dict[str, Any]]:
            body = {"payloads": [payload({"refs": refs})]}
            response = await client.post("/decode", json=body, headers={"Origin": UI})
            (decoded,) = (await response.json())["payloads"]
            return list(value_of(decoded)["payload"]["refs"])

        *read, over = await refs_of([code] * (codec.MAX_REFS + 1))
        assert [r["content"] for r in read] == ["print(1)\n"] * codec.MAX_REFS
        assert "content" not in over and over["content_error"] == codec.OVER_REFS
        monkeypatch.setattr(
            codec_resolver, "MAX_SECONDS", -1.0
        )  # its time is up before its first read
        (late,) = await refs_of([code])
        assert "content" not in late and late["content_error"] == codec.OVER_TIME
    assert len(refusals()) == 3 and all(line.startswith("not shown: ") for line in refusals())
