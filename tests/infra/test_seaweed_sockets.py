"""The unix sockets of the embedded SeaweedFS: not left in /tmp for good.

`weed mini` serves each of its servers on a unix socket beside its ports, in /tmp and named by
the port (`seaweedfs-<server>[-grpc]-<port>.sock`), and a weed that was killed, or even stopped
cleanly, leaves some there: ports are random, so none was ever reused (hundreds piled up).
- S3's and the filer's sockets (the two weed lets us place) live in the data dir when the path
  fits a socket's 107 bytes; where it does not, they keep weed's own /tmp name, spelled out;
- a weed's start sweeps the stale ones from the socket dir (here a test's own): a socket of
  SeaweedFS's name that refuses a connection (nothing listens) and is not a fresh one (a weed
  starting binds it before it listens); a listening one stays, as does a file of that name that
  is no socket, a socket of another name, a fresh one, and a symlink.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from infra import seaweed
from infra.seaweed import SeaweedPorts, seaweed_command, sweep_stale_sockets


@pytest.fixture
def sockets_dir(tmp_path: Path) -> Iterator[Path]:
    """`tmp_path/sockets` by a short name, a link /tmp/swsk-<random> (pytest's tmp paths and a
    socket's name may pass sun_path's 107 bytes); only the link is removed there, after."""
    target = tmp_path / "sockets"
    target.mkdir()
    link = Path("/tmp") / f"swsk-{os.getpid()}-{os.urandom(4).hex()}"
    link.symlink_to(target, target_is_directory=True)
    try:
        yield link
    finally:
        assert link.is_symlink() and link.name.startswith("swsk-") and link.resolve() == target
        link.unlink()


def bound(path: Path, listen: bool) -> socket.socket:
    """A unix socket bound at `path`, listening or not (closed: the file stays, refusing)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    if listen:
        sock.listen()
    return sock


def aged(path: Path, seconds: float = 3600) -> Path:
    past = time.time() - seconds
    os.utime(path, (past, past), follow_symlinks=False)
    return path


def test_the_sweep_removes_only_stale_seaweedfs_sockets(sockets_dir: Path) -> None:
    with ExitStack() as stack:
        live = sockets_dir / "seaweedfs-s3-12345.sock"
        stack.enter_context(bound(live, listen=True))
        stale = [sockets_dir / "seaweedfs-s3-12346.sock"]
        stale.append(sockets_dir / "seaweedfs-admin-grpc-22724.sock")
        stale.append(sockets_dir / "seaweedfs-filer-12723.sock")
        for path in stale:
            bound(path, listen=False).close()
        fresh = sockets_dir / "seaweedfs-volume-grpc-22722.sock"  # a weed binding it now
        bound(fresh, listen=False).close()
        foreign = sockets_dir / "other-s3-12347.sock"
        bound(foreign, listen=False).close()
        unnamed = sockets_dir / "seaweedfs-s3-x12348.sock"
        bound(unnamed, listen=False).close()
        not_a_socket = sockets_dir / "seaweedfs-s3-12349.sock"
        not_a_socket.write_text("a file by that name")
        link = sockets_dir / "seaweedfs-s3-12350.sock"
        link.symlink_to(stale[0])
        for path in [live, *stale, foreign, unnamed, not_a_socket, link]:
            aged(path)

        assert sweep_stale_sockets(sockets_dir) == len(stale)
        left = {path.name for path in sockets_dir.iterdir()}
        kept = [live, fresh, foreign, unnamed, not_a_socket, link]
        assert left == {path.name for path in kept}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.connect(str(live))  # still served

        aged(fresh)  # its weed died: the next sweep takes it
        assert sweep_stale_sockets(sockets_dir) == 1 and not fresh.exists()


def test_the_command_sweeps_and_places_the_sockets_it_can_in_the_data_dir(
    sockets_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seaweed, "SOCKET_DIR", sockets_dir)
    stale = sockets_dir / "seaweedfs-master-grpc-22721.sock"
    bound(stale, listen=False).close()
    aged(stale)
    data = sockets_dir.resolve() / "data"  # where weed's own path to its data dir leads
    if len(os.fsencode(data / "filer.sock")) > 107:
        pytest.skip(f"pytest's temp dir is too deep for a socket's path: {data}")
    cmd = seaweed_command(sockets_dir / "data", 20005, "ak", "sk", base_port=20000)
    assert not any(p.name.startswith("seaweedfs-") for p in sockets_dir.iterdir())
    assert f"-s3.localSocket={data / 's3.sock'}" in cmd
    assert f"-filer.localSocket={data / 'filer.sock'}" in cmd

    deep = sockets_dir / ("d" * 90)  # `deep/filer.sock` passes 107 bytes: weed's /tmp names
    cmd = seaweed_command(deep, 20005, "ak", "sk", base_port=20000)
    ports = SeaweedPorts.from_base(20005, 20000)
    assert f"-s3.localSocket={sockets_dir}/seaweedfs-s3-{ports.s3}.sock" in cmd
    assert f"-filer.localSocket={sockets_dir}/seaweedfs-filer-{ports.filer}.sock" in cmd
