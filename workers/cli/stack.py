"""`tempered up`, `tempered down`, `tempered worker QUEUE|all`: the embedded stack and workers.

    tempered up                  Temporal dev server (+ UI) and SeaweedFS S3, in the background
    tempered down                stop them, and the background workers `tempered train` started
    tempered worker sandbox      run one queue's worker in the foreground (`all`: every queue)

What `up` starts and on which ports is `infra.stack`'s; how a worker runs is `workers.runtime`'s.
"""

from __future__ import annotations

import argparse
import asyncio

from contracts.names import Queue
from infra import stack
from infra.processes import limit_openmp_spin
from infra.settings import Settings
from workers.background import stop_workers
from workers.runtime import run_workers


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    commands.add_parser("up", help="start the embedded stack").set_defaults(func=up)
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
