"""Where the embedded stack's services are, as settings place them: Temporal's gRPC endpoint and
Web UI, the embedded S3's endpoint (None: an external one), each service's pidfile-backed
`Service` under `settings.home`, and the check that one of ours that runs listens there.

    temporal_endpoint(settings)          # Endpoint("127.0.0.1", 7233), printed "127.0.0.1:7233"
    temporal_service(settings).pid()     # the dev server of ours that runs, or None
    listening(service, host, port)       # StackError: it runs, started with other ports

Starting, stopping and reporting them is `infra.stack`'s, which raises `StackError` too; this
module starts nothing, and imports nothing of infra.stack. SeaweedFS's service removes the unix
sockets its weed leaves when it stops it (`SeaweedService`): every stop, `down`'s, a failed
`up`'s, a test's restart, goes through it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from urllib.parse import urlparse

import psutil

from infra.processes import Service, wait_for_port
from infra.seaweed import remove_sockets
from infra.settings import Settings

LISTEN_WAIT_S = 5.0
"""How long a service of ours that runs may take to listen (another command may be starting it),
and an external Temporal to answer."""


class StackError(RuntimeError):
    """The stack could not start; the message says why and what to do."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def temporal_endpoint(settings: Settings) -> Endpoint:
    host, _, port = settings.temporal.address.rpartition(":")
    return Endpoint(host or "127.0.0.1", int(port))


def s3_endpoint(settings: Settings) -> Endpoint | None:
    """The embedded S3's endpoint, or None when settings point at an external S3."""
    url = urlparse(settings.s3.endpoint or "")
    if url.hostname not in {"127.0.0.1", "localhost"} or url.port is None:
        return None
    return Endpoint("127.0.0.1", url.port)


def temporal_ui(settings: Settings) -> str | None:
    """The embedded dev server's Web UI, or None when Temporal is external (its UI is not ours
    to know)."""
    if not settings.temporal.embedded:
        return None
    return f"http://{temporal_endpoint(settings).host}:{settings.temporal.ui_port}"


def temporal_service(settings: Settings) -> Service:
    return Service("temporal", settings.home)


@dataclass(frozen=True)
class SeaweedService(Service):
    """The embedded SeaweedFS's process, whose stop also removes the unix sockets its weed left
    (`infra.seaweed.remove_sockets`: weed leaves some in /tmp even when it stops cleanly)."""

    def stop(self, timeout_s: float = 15.0) -> bool:
        if not self.pidfile.exists():  # none ran: nothing to lock (a read-only home stays so)
            return False
        with self.lock():  # no start in between: its sockets are the next weed's
            command: list[str] = []
            if (pid := self.pid()) is not None:
                with contextlib.suppress(psutil.Error):
                    command = psutil.Process(pid).cmdline()
            stopped = super().stop(timeout_s)
            if command:
                remove_sockets(command)
            return stopped


def seaweed_service(settings: Settings) -> SeaweedService:
    return SeaweedService("seaweedfs", settings.home)


def codec_service(settings: Settings) -> Service:
    return Service("codec", settings.home)


def listening(service: Service, host: str, port: int) -> None:
    """A service of ours runs: it must be where these settings look for it (one started with
    other ports every later call would fail to reach). A start in flight gets a few seconds."""
    try:
        wait_for_port(host, port, LISTEN_WAIT_S, service)
    except (RuntimeError, TimeoutError):
        raise StackError(
            f"{service.name} runs, but not at {host}:{port}: it was started with other "
            "settings; `tempered down`, then `tempered up` with these"
        ) from None
