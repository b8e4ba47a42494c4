"""The ports `tempered up` needs free, checked for every service it would start before it
starts any (`infra.stack.up`): it started Temporal, then found SeaweedFS's port taken, and left
the dev server running.

    check_ports(settings)      # StackError naming each service's first taken port

A service of ours that runs (its pidfile's process lives) is not checked: `up` leaves it as it is.
Two of the services `up` would run on one port (`colliding`) are refused first, whether they run
or not, naming both settings: an S3 endpoint on Temporal's HTTP port passed, and SeaweedFS failed
to start ("s3://tempered not found") after Temporal had.
"""

from __future__ import annotations

from infra.processes import port_open
from infra.seaweed import GRPC_OFFSET, SeaweedPorts
from infra.settings import Settings
from infra.stack_services import (
    StackError,
    s3_endpoint,
    seaweed_service,
    temporal_endpoint,
    temporal_service,
)


def check_ports(settings: Settings) -> None:
    """StackError naming each taken port of a service `up` would start (one not running): all
    are checked before any starts. The codec server's is not here: a display aid, its taken
    port is reported by `_start_codec`, not fatal. Ports that collide are refused first."""
    if problem := colliding(settings):
        raise StackError(f"{problem}. Nothing started")
    taken = []
    endpoint = temporal_endpoint(settings)
    if settings.temporal.embedded and temporal_service(settings).pid() is None:
        for port in (endpoint.port, settings.temporal.ui_port, settings.temporal.http_port):
            if port_open(endpoint.host, port):
                theirs = (
                    " (or, if a Temporal to use as it is answers there, "
                    "TEMPERED_TEMPORAL__EMBEDDED=false)"
                    if port == endpoint.port
                    else ""
                )
                taken.append(
                    f"port {endpoint.host}:{port} is taken by another process; stop it or set "
                    f"TEMPERED_TEMPORAL__ADDRESS / __UI_PORT / __HTTP_PORT{theirs}"
                )
                break
    s3 = s3_endpoint(settings)
    if s3 is not None and seaweed_service(settings).pid() is None:
        ports = SeaweedPorts.from_base(s3.port, settings.s3.embedded_base_port)
        for port in ports.all_ports():
            if port and port_open("127.0.0.1", port):
                taken.append(
                    f"port 127.0.0.1:{port} (SeaweedFS) is taken by another process; stop it or "
                    "set TEMPERED_S3__ENDPOINT / TEMPERED_S3__EMBEDDED_BASE_PORT"
                )
                break
    if taken:
        raise StackError(". ".join(taken) + ". Nothing started")


def _setting(section: str, field: str) -> str:
    return f"{section}.{field} (TEMPERED_{section.upper()}__{field.upper()})"


def _ports(settings: Settings) -> list[tuple[int, str]]:
    """Every port of the embedded services, each with the setting that gives it: Temporal's
    (frontend, UI, HTTP, the UI's codec server) where it is embedded, SeaweedFS's (S3 and its
    base ports, each with its gRPC port +GRPC_OFFSET) where S3 is."""
    ports = []
    if settings.temporal.embedded:
        temporal = settings.temporal
        ports += [
            (temporal_endpoint(settings).port, _setting("temporal", "address")),
            (temporal.ui_port, _setting("temporal", "ui_port")),
            (temporal.http_port, _setting("temporal", "http_port")),
            (temporal.codec_port, _setting("temporal", "codec_port")),
        ]
    if (s3 := s3_endpoint(settings)) is not None:
        endpoint, base = _setting("s3", "endpoint"), settings.s3.embedded_base_port
        ports += [
            (s3.port, endpoint),
            (s3.port + GRPC_OFFSET, f"{endpoint}'s port + {GRPC_OFFSET}"),
        ]
        named = _setting("s3", "embedded_base_port")
        for offset in (*range(5), *range(GRPC_OFFSET, GRPC_OFFSET + 5)):
            ports.append((base + offset, named.replace(" (", f" + {offset} (", 1)))
    return ports


def colliding(settings: Settings) -> str | None:
    """The first two settings that put two embedded services on one port, said; None if none."""
    seen: dict[int, str] = {}
    for port, setting in _ports(settings):
        if port in seen:
            return (
                f"port {port} is given twice: by {seen[port]} and by {setting}; set one of "
                "them to another port"
            )
        seen[port] = setting
    return None
