"""`tempered codec`: the Temporal Web UI's codec server, in the foreground.

    tempered codec                           on settings.temporal.codec_port, for the embedded UI
    tempered codec --port 8234 --origin https://temporal.example.com

`tempered up` already runs one in the background for the embedded UI; this is for a UI
elsewhere (point its codec endpoint, `TEMPORAL_CODEC_ENDPOINT`, here). What it shows and what
it refuses: `infra.codec`.
"""

from __future__ import annotations

import argparse
import asyncio

from infra import codec
from infra.settings import Settings
from infra.storage import ObjectStore


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser("codec", help="serve the Web UI's codec (S3 references shown)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, help="default: settings.temporal.codec_port")
    parser.add_argument(
        "--origin",
        action="append",
        help="a UI origin allowed to ask (repeatable); default: the embedded UI",
    )
    parser.set_defaults(func=serve)


def serve(args: argparse.Namespace, settings: Settings) -> int:
    port = args.port or settings.temporal.codec_port
    origins = args.origin or codec.ui_origins(settings.temporal.ui_port)
    print(f"codec server on http://{args.host}:{port} for {', '.join(origins)}", flush=True)
    asyncio.run(codec.serve(ObjectStore.from_settings(settings), args.host, port, origins))
    return 0
