"""Embedded and test ports never fall in the kernel's ephemeral range, where an outgoing
connection can hold a port between our check and the server's bind (the chaos drill once failed
that way: a restarted SeaweedFS could not bind its gRPC port)."""

from __future__ import annotations

import socket

from infra.processes import ephemeral_ports, free_port
from infra.seaweed import SeaweedPorts, pick_free_ports
from infra.settings import S3Settings


def test_free_ports_are_outside_the_ephemeral_range() -> None:
    ephemeral = ephemeral_ports()
    ports = [free_port() for _ in range(200)]
    assert not [p for p in ports if p in ephemeral]
    assert len(set(ports)) > 100, "picked at random, so parallel stacks rarely collide"


def test_seaweed_layouts_keep_grpc_ports_outside_the_ephemeral_range() -> None:
    ephemeral = ephemeral_ports()
    for _ in range(50):
        s3_port, base = pick_free_ports()
        layout = SeaweedPorts.from_base(s3_port, base).all_ports()
        assert not [p for p in layout if p in ephemeral], layout


def test_every_picked_layout_is_one_the_settings_accept() -> None:
    """The stack fixtures hand the base to S3Settings: a base its bound refuses failed a test
    at random (22001-22763 were picked here, where the ephemeral range starts at 32768)."""
    for _ in range(100):  # one in 18 fell there: all 100 passing by chance is 3e-3
        s3_port, base = pick_free_ports()
        S3Settings(endpoint=f"http://127.0.0.1:{s3_port}", embedded_base_port=base)


def test_a_taken_port_is_skipped() -> None:
    with socket.socket() as held:
        port = free_port()
        held.bind(("127.0.0.1", port))
        assert free_port(range(port, port + 2)) == port + 1
