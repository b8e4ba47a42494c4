"""`tempered up`'s S3 half (`infra.stack._start_seaweed`) in a scratch home: an external S3 is
checked for conditional writes, and an embedded SeaweedFS that exits or hangs is reported at once.

The external S3 is the test SeaweedFS reached through a forwarder on 127.0.0.2 (any host but
127.0.0.1/localhost is external to `infra.stack`), or a small fake S3 that answers 501. The
embedded SeaweedFS that misbehaves is a fake too, a Python process under `up`'s pidfile that
listens on the S3 port and never answers: a real one cannot be made to fail so on cue.
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra import stack, storage
from infra.seaweed import pick_free_ports
from infra.settings import S3Settings, Settings
from infra.storage import ObjectStore
from tests.fixtures.s3 import SeaweedServer

NOT_ANSWERING = """
import socket, sys, time
server = socket.create_server(("127.0.0.1", int(sys.argv[1])))  # accepts, never answers
print("fake weed: volume server failed: no space left on device", flush=True)
time.sleep(float(sys.argv[2]))
"""
"""A SeaweedFS stand-in: listens on the S3 port for argv[2] seconds, then exits."""


class Forwarder:
    """127.0.0.2:port → 127.0.0.1:`upstream`, byte for byte."""

    def __init__(self, upstream: int):
        self._listener = socket.create_server(("127.0.0.2", 0))
        self.endpoint = f"http://127.0.0.2:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, args=(upstream,), daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self, upstream: int) -> None:
        with contextlib.suppress(OSError):  # closed
            while True:
                client = self._listener.accept()[0]
                server = socket.create_connection(("127.0.0.1", upstream))
                for src, dst in ((client, server), (server, client)):
                    threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


class NoConditionalWrites(http.server.BaseHTTPRequestHandler):
    """An S3 that answers 501 NotImplemented to a PUT with If-None-Match, 200 to the rest."""

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("If-None-Match") is None:
            self._reply(200, b"")
            return
        self._reply(
            501,
            b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>NotImplemented</Code><Message>"
            b"A header you provided implies functionality that is not implemented</Message>"
            b"</Error>",
        )

    def do_DELETE(self) -> None:
        self._reply(204, b"")

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def external(seaweed: SeaweedServer, store: ObjectStore, tmp_path: Path) -> Iterator[Settings]:
    """Settings whose S3 is the test SeaweedFS, as an external one (`store`'s bucket)."""
    forwarder = Forwarder(seaweed.s3_port)
    s3 = seaweed.settings.model_copy(
        update={"endpoint": forwarder.endpoint, "bucket": store.bucket}
    )
    try:
        yield Settings(home=tmp_path, config=None, s3=s3)
    finally:
        forwarder.close()


def _ignore_if_none_match(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every new store's client drops If-None-Match, as a store that ignores the header acts."""
    real = storage.s3_client

    def drop_condition(params: dict[str, Any], **_: Any) -> None:
        params.pop("IfNoneMatch", None)

    def client(s3: S3Settings, **config: Any) -> Any:
        made = real(s3, **config)
        made.meta.events.register("provide-client-params.s3.PutObject", drop_condition)
        return made

    monkeypatch.setattr(storage, "s3_client", client)


def test_an_external_s3_that_ignores_if_none_match_is_refused(
    external: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the embedded SeaweedFS was probed (when `up` started it): an external store that
    overwrote create-only writes silently lost exactly-once trajectories, acks and manifests."""
    _ignore_if_none_match(monkeypatch)
    with pytest.raises(stack.StackError, match="ignores If-None-Match") as err:
        stack._start_seaweed(external)
    assert f"S3 at {external.s3.endpoint} ignores" in str(err.value)


def test_an_external_s3_is_checked_once_per_endpoint_and_bucket(
    external: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = stack._start_seaweed(external)
    assert "external endpoint" in line and "conditional writes checked" in line
    _ignore_if_none_match(monkeypatch)  # a second `up` in this process does not probe again
    assert stack._start_seaweed(external) == line


def test_an_external_s3_without_conditional_writes_is_named(tmp_path: Path) -> None:
    """A 501 NotImplemented was transient: every create-only write retried for ever."""
    server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), NoConditionalWrites)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        s3 = S3Settings(endpoint=f"http://127.0.0.2:{server.server_address[1]}", bucket="b-501")
        with pytest.raises(stack.StackError, match="conditional writes") as err:
            stack._start_seaweed(Settings(home=tmp_path, config=None, s3=s3))
        assert "NotImplemented" in str(err.value)
    finally:
        server.shutdown()
        server.server_close()


def test_an_unreachable_external_s3_is_reported_not_checked(tmp_path: Path) -> None:
    """`train --no-workers` may name a store only its workers reach (an in-cluster address)."""
    port = pick_free_ports()[0]
    s3 = S3Settings(endpoint=f"http://127.0.0.2:{port}", connect_timeout_s=1.0)
    line = stack._start_seaweed(Settings(home=tmp_path, config=None, s3=s3))
    assert "not checked" in line and "connection refused" in line


def _embedded(tmp_path: Path) -> tuple[Settings, str]:
    """Settings of an embedded SeaweedFS on free ports, and its S3 port."""
    s3_port, base = pick_free_ports()
    s3 = S3Settings(endpoint=f"http://127.0.0.1:{s3_port}", embedded_base_port=base)
    return Settings(home=tmp_path, config=None, s3=s3), str(s3_port)


def test_a_seaweedfs_that_exits_after_opening_its_port_fails_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The readiness loops never looked at the process: `up` waited out START_TIMEOUT_S (60 s),
    then said "connection refused", without the log that says why."""
    settings, port = _embedded(tmp_path)
    command = [sys.executable, "-c", NOT_ANSWERING, port, "1.5"]
    monkeypatch.setattr(stack, "seaweed_command", lambda *_, **__: command)
    monkeypatch.setattr(stack, "START_TIMEOUT_S", 20.0)
    started = time.monotonic()
    with pytest.raises(stack.StackError, match="exited during start-up") as err:
        stack._start_seaweed(settings)
    assert "no space left on device" in str(err.value)  # the log's tail
    assert time.monotonic() - started < 10
    assert stack.seaweed_service(settings).pid() is None


def test_a_seaweedfs_that_runs_but_does_not_answer_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hung but alive (SIGSTOPped, say), it took 241 s and ended in a bare storage error: the
    already-running branch's request had the store's 60 s read timeout and 3 attempts."""
    settings, port = _embedded(tmp_path)
    service = stack.seaweed_service(settings)
    service.start([sys.executable, "-c", NOT_ANSWERING, port, "300"])
    monkeypatch.setattr(stack, "PROBE_TIMEOUT_S", 1.0)
    outcome: list[BaseException | str] = []

    def up() -> None:
        try:
            outcome.append(stack._start_seaweed(settings))
        except Exception as exc:  # the test inspects it
            outcome.append(exc)

    try:
        stack.wait_for_port("127.0.0.1", int(port), 10, service)
        thread = threading.Thread(target=up, daemon=True)
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive(), "`up` still waits on a SeaweedFS that does not answer"
        assert isinstance(outcome[0], stack.StackError), outcome
        assert "does not answer" in str(outcome[0])
        assert "`tempered down`, then `tempered up`" in str(outcome[0])
    finally:
        service.stop()
