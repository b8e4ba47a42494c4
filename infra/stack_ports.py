"""The ports `tempered up` needs free, checked for every service it would start before it
starts any (`infra.stack.up`): it started Temporal, then found SeaweedFS's port taken, and left
the dev server running.

    check_ports(settings)      # StackError naming each service's first taken port

A service of ours that runs (its pidfile's process lives) is not checked: `up` leaves it as it is.
"""

from __future__ import annotations

from infra.processes import port_open
from infra.seaweed import SeaweedPorts
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
    port is reported by `_start_codec`, not fatal."""
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
