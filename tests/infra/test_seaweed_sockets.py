"""The unix sockets of the embedded SeaweedFS: not left in /tmp for good.

`weed mini` serves each of its servers on a unix socket beside its ports, in /tmp and named by
the port (`seaweedfs-<server>[-grpc]-<port>.sock`), and a weed that was killed, or even stopped
cleanly, leaves some there: ports are random, so none was ever reused (hundreds piled up).
- S3's and the filer's sockets (the two weed lets us place) live in the data dir when the path
  fits a socket's 107 bytes; where it does not, they keep weed's own /tmp name, spelled out;
- each start of a weed (`tempered up`'s, the tests' fixture's), not its command line's builder,
  sweeps the stale ones from the socket dir (here a test's own): a socket of SeaweedFS's name
  that refuses a connection (nothing listens) and is not a fresh one (a weed starting binds it
  before it listens); a listening one stays, as does a file of that name that is no socket, a
  socket of another name, a fresh one, and a symlink;
- each stop of a weed (`tempered down`'s, the fixture's) removes that weed's own: those its
  command line placed and those named by one of its ports, unless one listens (a later weed's).
"""

from __future__ import annotations

import os
import socket
import stat
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from infra import seaweed, stack
from infra.seaweed import SeaweedPorts, pick_free_ports, seaweed_command, sweep_stale_sockets
from infra.settings import S3Settings, Settings
from tests.fixtures.s3 import SeaweedServer


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


def test_the_command_places_the_sockets_it_can_in_the_data_dir_and_sweeps_nothing(
    sockets_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command line's builder swept /tmp (a side effect); the start sweeps, below."""
    monkeypatch.setattr(seaweed, "SOCKET_DIR", sockets_dir)
    stale = sockets_dir / "seaweedfs-master-grpc-22721.sock"
    bound(stale, listen=False).close()
    aged(stale)
    data = sockets_dir.resolve() / "data"  # where weed's own path to its data dir leads
    if len(os.fsencode(data / "filer.sock")) > 107:
        pytest.skip(f"pytest's temp dir is too deep for a socket's path: {data}")
    cmd = seaweed_command(sockets_dir / "data", 20005, "ak", "sk", base_port=20000)
    assert stale.exists()
    assert f"-s3.localSocket={data / 's3.sock'}" in cmd
    assert f"-filer.localSocket={data / 'filer.sock'}" in cmd

    deep = sockets_dir / ("d" * 90)  # `deep/filer.sock` passes 107 bytes: weed's /tmp names
    cmd = seaweed_command(deep, 20005, "ak", "sk", base_port=20000)
    ports = SeaweedPorts.from_base(20005, 20000)
    assert f"-s3.localSocket={sockets_dir}/seaweedfs-s3-{ports.s3}.sock" in cmd
    assert f"-filer.localSocket={sockets_dir}/seaweedfs-filer-{ports.filer}.sock" in cmd


def test_a_stop_removes_the_dead_sockets_of_its_own_ports_only(
    sockets_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(seaweed, "SOCKET_DIR", sockets_dir)
    monkeypatch.setattr(seaweed, "LAST_BREATH_S", 0.2)  # what the live one is given to refuse
    data = sockets_dir.resolve() / "data"
    if len(os.fsencode(data / "filer.sock")) > 107:
        pytest.skip(f"pytest's temp dir is too deep for a socket's path: {data}")
    command = seaweed_command(data, 20005, "ak", "sk", base_port=20000)
    ports = SeaweedPorts.from_base(20005, 20000)
    with ExitStack() as stack:
        live = sockets_dir / f"seaweedfs-master-grpc-{ports.master + 10000}.sock"
        stack.enter_context(bound(live, listen=True))  # a later weed's on that port
        dead = [
            sockets_dir / f"seaweedfs-{name}-grpc-{getattr(ports, name) + 10000}.sock"
            for name in ("s3", "admin")
        ]
        dead += [data / "s3.sock", data / "filer.sock"]  # placed by the command
        other = sockets_dir / "seaweedfs-s3-grpc-20015.sock"  # another weed's
        for path in [*dead, other]:
            bound(path, listen=False).close()  # fresh, as a stop leaves them

        assert seaweed.remove_sockets(command) == len(dead)
        assert not any(path.exists() for path in dead)
        assert live.exists() and other.exists()


Started = tuple[Callable[[], None], list[int]]
"""A weed's stop, and its ports (`SeaweedPorts.all_ports`)."""


def _stack_start(home: Path) -> Started:
    """`tempered up`'s start of SeaweedFS in `home`; its stop is `tempered down`'s."""
    s3_port, base = pick_free_ports()
    s3 = S3Settings(endpoint=f"http://127.0.0.1:{s3_port}", embedded_base_port=base)
    settings = Settings(home=home, config=None, s3=s3)

    def stop() -> None:
        assert "seaweedfs: stopped" in stack.down(settings)

    try:
        stack._start_seaweed(settings)
    except BaseException:
        stack.down(settings)
        raise
    return stop, SeaweedPorts.from_base(s3_port, base).all_ports()


def _fixture_start(home: Path) -> Started:
    """The tests' SeaweedFS (tests/fixtures/s3.py) started in `home`."""
    home.mkdir()
    server = SeaweedServer(home)
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    return server.stop, SeaweedPorts.from_base(server.s3_port, server.base_port).all_ports()


STARTS = [pytest.param(_stack_start, id="stack"), pytest.param(_fixture_start, id="fixture")]


@pytest.mark.parametrize("start", STARTS)
def test_each_start_of_a_weed_sweeps_the_stale_sockets(
    start: Callable[[Path], Started],
    sockets_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with monkeypatch.context() as patched:
        patched.setattr(seaweed, "SOCKET_DIR", sockets_dir)
        stale = sockets_dir / "seaweedfs-master-grpc-22721.sock"
        bound(stale, listen=False).close()
        aged(stale)
        stop, _ = start(tmp_path / "home")
    try:
        assert not stale.exists(), "the start swept nothing"
    finally:
        stop()


def _sockets_of(home: Path, ports: Iterable[int]) -> list[str]:
    """The unix sockets of a weed on `ports` (weed's names in /tmp) and with its data under
    `home` (those placed there)."""
    numbers = {str(port) for port in ports}
    named = [
        path
        for path in seaweed.SOCKET_DIR.glob("seaweedfs-*.sock")
        if path.name.removesuffix(".sock").rpartition("-")[2] in numbers
    ]
    placed = [path for path in home.rglob("*.sock") if stat.S_ISSOCK(path.lstat().st_mode)]
    return sorted(str(path) for path in named + placed)


@pytest.mark.parametrize("start", STARTS)
def test_a_stopped_weed_leaves_no_socket_of_its_own(
    start: Callable[[Path], Started], tmp_path: Path
) -> None:
    """A clean stop soon after the start left the admin's and S3's gRPC sockets in /tmp (each
    time), and S3's in the data dir, until a later start's sweep (60 s on)."""
    home = tmp_path / "home"
    stop, ports = start(home)
    assert _sockets_of(home, ports), "the weed made no socket to leave"
    stop()
    assert _sockets_of(home, ports) == []
