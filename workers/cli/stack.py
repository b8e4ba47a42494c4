"""`tempered up`, `tempered down`, `tempered worker QUEUE|all`: the embedded stack and workers.

    tempered up                  Temporal dev server (+ UI) and SeaweedFS S3, in the background
                                 (an external Temporal or S3 is used as it is, never started)
    tempered down                stop them, and the background workers `tempered train` started
    tempered worker sandbox      run one queue's worker in the foreground (`all`: every queue)

What `up` starts and on which ports is `infra.stack`'s (`up --help` lists the settings that
move it off taken ports); how a worker runs is `workers.runtime`'s.
"""

from __future__ import annotations

import argparse
import asyncio

from contracts.names import Queue
from infra import stack
from infra.processes import limit_openmp_spin
from infra.settings import S3Settings, Settings, TemporalSettings
from workers.background import stop_workers
from workers.runtime import run_workers

PORTS = (
    ("temporal", "address", "gRPC frontend"),
    ("temporal", "ui_port", "Web UI"),
    ("temporal", "http_port", "HTTP API"),
    ("temporal", "codec_port", "the UI's codec server"),
    ("s3", "endpoint", "S3"),
    ("s3", "embedded_base_port", "SeaweedFS's own: 5 from here, and each +10000"),
)
"""The settings that place the embedded stack, for `tempered up --help`."""


def up_description() -> str:
    """What `up` starts, and the settings (with their defaults) that move it off taken ports."""
    defaults = {"temporal": TemporalSettings(), "s3": S3Settings()}
    assigned = [
        (f"TEMPERED_{section.upper()}__{name.upper()}={getattr(defaults[section], name)}", what)
        for section, name, what in PORTS
    ]
    width = max(len(text) for text, _ in assigned)
    lines = [f"  {text:<{width}}  {what}" for text, what in assigned]
    return (
        "Start Temporal (+ Web UI), SeaweedFS (S3) and the UI's codec server in the background,\n"
        "their state under settings.home ($TEMPERED_HOME). Their ports are settings, set as\n"
        "TEMPERED_ variables or in tempered.toml ([temporal] address = ...), all on 127.0.0.1\n"
        "and below 32768:\n\n" + "\n".join(lines) + "\n\n"
        "TEMPERED_TEMPORAL__EMBEDDED=false uses the Temporal at __ADDRESS as it is (a cluster, a\n"
        "server of your own): `up` starts no Temporal (nor the codec server of its UI), only\n"
        "checks that it answers, and `down` leaves it running."
    )


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    starting = commands.add_parser(
        "up",
        help="start the embedded stack",
        description=up_description(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    starting.set_defaults(func=up)
    stopping = commands.add_parser("down", help="stop what `up` started, and background workers")
    stopping.set_defaults(func=down)
    running = commands.add_parser("worker", help="run the worker of a task queue")
    running.add_argument("queue", choices=[q.value for q in Queue] + ["all"])
    running.set_defaults(func=worker)


def up(args: argparse.Namespace, settings: Settings) -> int:
    for line in stack.up(settings):
        print(line)
    return 0


def down(args: argparse.Namespace, settings: Settings) -> int:
    for line in stop_workers(settings) + stack.down(settings):
        print(line)
    return 0


def worker(args: argparse.Namespace, settings: Settings) -> int:
    queues = list(Queue) if args.queue == "all" else [Queue(args.queue)]
    limit_openmp_spin(settings.omp_spin_count)  # before the workers import torch
    asyncio.run(run_workers(queues, settings))
    return 0
