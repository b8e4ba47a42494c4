"""A worker's identity as Temporal lists it among a queue's pollers: `queue@host:pid`.

Written by `workers.runtime` for each Worker it builds, read by `workers.background` to tell
whether a listed poller's process still runs (a poller stays listed a while after it exits)."""

from __future__ import annotations

import os
import socket


def worker_identity(queue: str, pid: int | None = None) -> str:
    """The identity of process `pid` (default: this one) as a worker of `queue` on this host."""
    return f"{queue}@{socket.gethostname()}:{os.getpid() if pid is None else pid}"


def identity_host_pid(identity: str) -> tuple[str, int | None]:
    """The host and pid an identity names; pid None where it names none (another client's)."""
    host, _, pid = identity.partition("@")[2].rpartition(":")
    return host, int(pid) if pid.isdigit() else None
