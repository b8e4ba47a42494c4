"""`tempered up` against a Temporal dev server (and codec server) of ours that already runs: it
must run as these settings would start it. Only the gRPC port was checked, so after a change of
`ui_port`, `http_port`, `codec_port` or `namespace` `up` said "already running" (the codec
"already running at" a port it did not listen on), and with another namespace `train` failed
with "Namespace other is not found" while `up` kept saying "already running".

The running servers are stand-ins: a Python process under the service's pidfile that listens
where the real one would, its pidfile's `argv` rewritten to the command `up` would have run."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import stack
from infra.processes import Service, free_port, wait_for_port
from infra.settings import Settings, TemporalSettings

LISTEN = """
import socket, sys, time
servers = [socket.create_server(("127.0.0.1", int(port))) for port in sys.argv[1:]]
time.sleep(300)
"""
"""Listens on every port in argv for 300 s, answering nothing."""


def settings_at(home: Path, **temporal: object) -> Settings:
    base = {
        "address": f"127.0.0.1:{free_port()}",
        "ui_port": free_port(),
        "http_port": free_port(),
        "codec_port": free_port(),
    }
    return Settings(home=home, temporal=TemporalSettings.model_validate(base | temporal))


def started_as(service: Service, argv: list[str] | None, *ports: int) -> None:
    """Run the stand-in under `service`'s pidfile, which then records `argv` (None: no argv, as
    a pidfile of an earlier release)."""
    service.start([sys.executable, "-c", LISTEN, *map(str, ports)])
    record = json.loads(service.pidfile.read_text())
    if argv is None:
        del record["argv"]
    else:
        record["argv"] = argv
    service.pidfile.write_text(json.dumps(record))
    for port in ports:
        wait_for_port("127.0.0.1", port, 10, service)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Settings]:
    """A Temporal of ours runs, started by `up` with the returned settings."""
    settings = settings_at(tmp_path / "home")
    service = stack.temporal_service(settings)
    grpc = stack.temporal_endpoint(settings).port
    started_as(service, stack.temporal_command(settings), grpc, settings.temporal.ui_port)
    try:
        yield settings
    finally:
        service.stop()


def changed(settings: Settings, **temporal: object) -> Settings:
    update = {"temporal": settings.temporal.model_copy(update=temporal)}
    return settings.model_copy(update=update)


def test_a_temporal_started_with_these_settings_is_already_running(running: Settings) -> None:
    endpoint = stack.temporal_endpoint(running)
    assert stack._start_temporal(running) == f"temporal: already running at {endpoint}"


@pytest.mark.parametrize(
    ("field", "flag", "variable"),
    [
        ("ui_port", "--ui-port", "TEMPERED_TEMPORAL__UI_PORT"),
        ("http_port", "--http-port", "TEMPERED_TEMPORAL__HTTP_PORT"),
        ("codec_port", "--ui-codec-endpoint", "TEMPERED_TEMPORAL__CODEC_PORT"),
        ("namespace", "--namespace", "TEMPERED_TEMPORAL__NAMESPACE"),
    ],
)
def test_a_temporal_started_with_other_settings_is_refused_naming_what_differs(
    running: Settings, field: str, flag: str, variable: str
) -> None:
    value = "other" if field == "namespace" else free_port()
    was = getattr(running.temporal, field)
    with pytest.raises(stack.StackError) as refused:
        stack._start_temporal(changed(running, **{field: value}))
    message = str(refused.value)
    pid = stack.temporal_service(running).pid()
    assert message.startswith(f"temporal runs (pid {pid}) with other settings than these: {flag}")
    assert str(was) in message and str(value) in message and variable in message
    assert "`tempered down`, then `tempered up`" in message
    assert stack.temporal_service(running).pid() == pid  # left running


def test_a_pidfile_without_its_command_is_checked_by_port_alone(tmp_path: Path) -> None:
    """A pidfile of an earlier release records no argv: nothing to compare, as before."""
    settings = settings_at(tmp_path / "home")
    service = stack.temporal_service(settings)
    started_as(service, None, stack.temporal_endpoint(settings).port)
    try:
        assert "already running" in stack._start_temporal(changed(settings, namespace="x"))
    finally:
        service.stop()


def test_a_codec_server_that_listens_elsewhere_is_refused(tmp_path: Path) -> None:
    """It printed "codec: already running at http://127.0.0.1:22373" while it listened on
    22372 (its port is in its environment, which its pidfile does not record)."""
    settings = settings_at(tmp_path / "home")
    service = stack.codec_service(settings)
    started_as(service, [sys.executable, "-m", "infra.codec"], settings.temporal.codec_port)
    try:
        assert stack._start_codec(settings).startswith("codec: already running at ")
        with pytest.raises(stack.StackError, match="codec runs, but not at 127.0.0.1:"):
            stack._start_codec(changed(settings, codec_port=free_port()))
    finally:
        service.stop()
