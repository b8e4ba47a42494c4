"""The embedded SeaweedFS: its command line, its ports, its authentication, its readiness wait."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from infra import processes
from infra.seaweed import (
    GRPC_OFFSET,
    SeaweedPorts,
    pick_free_ports,
    seaweed_command,
    wait_s3_ready,
)
from infra.storage import ObjectStore
from tests.fixtures.s3 import SeaweedServer


def test_command_is_loopback_only_without_telemetry(tmp_path: Path) -> None:
    cmd = seaweed_command(tmp_path / "data", 20005, "ak", "sk", base_port=20000)
    assert "mini" in cmd
    for flag in ("-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-master.telemetry=false"):
        assert flag in cmd
    ports = SeaweedPorts.from_base(20005, 20000)
    for name in ("s3", "master", "volume", "filer", "admin"):
        port = getattr(ports, name)
        assert f"-{name}.port={port}" in cmd
        assert f"-{name}.port.grpc={port + GRPC_OFFSET}" in cmd
    config = next(arg.split("=", 1)[1] for arg in cmd if arg.startswith("-s3.config="))
    identity = json.loads(Path(config).read_text())["identities"][0]
    assert identity["credentials"] == [{"accessKey": "ak", "secretKey": "sk"}]


def test_base_port_must_leave_room_for_grpc_ports() -> None:
    with pytest.raises(ValueError, match="gRPC"):
        SeaweedPorts.from_base(8333, 60000)


def test_listens_only_on_its_own_loopback_ports(seaweed: SeaweedServer) -> None:
    seaweed.start()
    assert seaweed.pid is not None
    proc = psutil.Process(seaweed.pid)
    expected = set(SeaweedPorts.from_base(seaweed.s3_port, seaweed.base_port).all_ports())
    listening = {
        (conn.laddr.ip, conn.laddr.port)
        for conn in proc.net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN
    }
    assert listening, "weed mini listens on nothing"
    assert {ip for ip, _ in listening} == {"127.0.0.1"}
    assert {port for _, port in listening} <= expected
    assert seaweed.s3_port in {port for _, port in listening}


def test_two_instances_side_by_side(seaweed: SeaweedServer, tmp_path: Path) -> None:
    seaweed.start()
    other = SeaweedServer(tmp_path)
    other.start()
    try:
        first, second = seaweed.store(), other.store("side-by-side")
        first.put_bytes("k", b"first")
        second.put_bytes("k", b"second")
        assert first.get_bytes("k") == b"first"
        assert second.get_bytes("k") == b"second"
    finally:
        other.stop()


def test_anonymous_requests_are_refused(store: ObjectStore, seaweed: SeaweedServer) -> None:
    store.put_bytes("secret", b"x")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{seaweed.endpoint}/{store.bucket}/secret", timeout=5)
    assert err.value.code == 403


def test_wait_s3_ready_times_out_naming_the_endpoint() -> None:
    s3_port, _ = pick_free_ports()
    endpoint = f"http://127.0.0.1:{s3_port}"
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=f"S3 at {endpoint} not ready after 1s"):
        wait_s3_ready(endpoint, timeout_s=1.0)
    assert time.monotonic() - started < 5


def test_layouts_avoid_the_hosts_own_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host whose outgoing connections take ports from 10000 (`ip_local_port_range`): the
    layouts once kept to a fixed 10000-22000 and landed there (free_port read the range)."""
    ephemeral = range(10000, 20000)
    monkeypatch.setattr(processes, "ephemeral_ports", lambda: ephemeral)
    for _ in range(20):
        s3_port, base = pick_free_ports()
        layout = SeaweedPorts.from_base(s3_port, base).all_ports()
        assert not [p for p in layout if p in ephemeral], layout
