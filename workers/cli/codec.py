"""`tempered codec`: the Temporal Web UI's codec server, in the foreground.

    tempered codec                           on settings.temporal.codec_port, for the embedded UI
    tempered codec --port 8234 --origin https://temporal.example.com

`tempered up` already runs one in the background for the embedded UI; this is for a UI
elsewhere (point its codec endpoint, `TEMPORAL_CODEC_ENDPOINT`, here). What it shows and what
it refuses: `infra.codec`. `--origin` is an origin as a browser sends it (http or https and a
host, nothing after; kept lowercase), anything else refused (exit 2). `--port` is 1 to 65535;
the "codec server on …" line comes once the server listens, its own bind the one check of the
address (a port in use: one line on stderr, exit 1).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys

from infra import codec
from infra.settings import Settings
from infra.storage import ObjectStore


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("codec", help="serve the Web UI's codec (S3 references shown)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=tcp_port, help="default: settings.temporal.codec_port")
    parser.add_argument(
        "--origin",
        action="append",
        type=ui_origin,
        help="a UI origin allowed to ask, e.g. https://temporal.example.com (repeatable); "
        "default: the embedded UI",
    )
    parser.set_defaults(func=serve)


def serve(args: argparse.Namespace, settings: Settings) -> int:
    port = settings.temporal.codec_port if args.port is None else args.port
    origins = args.origin or codec.ui_origins(settings)
    listens = False

    def announce() -> None:  # the banner names a server that listens, never one that did not
        nonlocal listens
        listens = True
        print(f"codec server on http://{args.host}:{port} for {', '.join(origins)}", flush=True)

    store = ObjectStore.from_settings(settings)
    try:  # the server's own bind is the check: no probe, which another process could outrun
        asyncio.run(codec.serve(store, args.host, port, origins, listening=announce))
    except OSError as exc:
        if listens:
            raise
        print(f"tempered codec: cannot listen on {args.host}:{port} ({_why(exc)})", file=sys.stderr)
        return 1
    return 0


def _why(exc: OSError) -> str:
    """What an OSError of the bind says, as the system words it: "Address already in use",
    "Cannot assign requested address", "Name or service not known" (asyncio's own words
    name the address again, which the line names already)."""
    if isinstance(exc, socket.gaierror) or not exc.errno:
        return exc.strerror or str(exc)
    return os.strerror(exc.errno)


def ui_origin(text: str) -> str:
    """An argparse type: an origin as a browser sends it (`codec.ui_origin`: http or https, a
    host, no path, query or fragment; lowercase). `notaurl`, a path or `HTTPS://Host` were
    announced, then every request of that UI got 403."""
    try:
        return codec.ui_origin(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def tcp_port(text: str) -> int:
    """An argparse type: a TCP port, 1 to 65535 (70000 and -5 announced a server that never
    started; 0 became the default port)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (1 to 65535)")
    return value
