"""Embedded and test ports never fall in the kernel's ephemeral range, where an outgoing
connection can hold a port between our check and the server's bind (the chaos drill once failed
that way: a restarted SeaweedFS could not bind its gRPC port)."""

from __future__ import annotations

import socket

from infra.processes import ephemeral_ports, free_port
from infra.seaweed import SeaweedPorts, pick_free_ports


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


def test_a_taken_port_is_skipped() -> None:
    with socket.socket() as held:
        port = free_port()
        held.bind(("127.0.0.1", port))
        assert free_port(range(port, port + 2)) == port + 1
