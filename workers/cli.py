"""The `tempered` command line.

    tempered up | down | status            the embedded stack (Temporal + UI, SeaweedFS)
    tempered worker QUEUE|all              run a task queue's worker in the foreground
    tempered train [--preset tiny] ...     a training run, with progress and a report
    tempered eval --policy V --suite S     held-out pass@1 of a policy version
    tempered sandbox run PROGRAM.py        run one program as the sandbox activity would
    tempered tasks validate SUITE          canonical solutions pass, wrong ones fail
    tempered runs ls | show RUN            what is stored for runs
    tempered regrade RUN                   re-score stored trajectories

Arguments and configuration are parsed before anything heavy (torch) is imported. The process
ends with `os._exit` after flushing: the Temporal SDK may abort at interpreter exit.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from collections.abc import Callable

from pydantic import ValidationError

from contracts.names import Queue

SUBCOMMAND_MODULES = (
    "workers.cli_train",
    "workers.cli_eval",
    "workers.cli_sandbox",
    "workers.cli_tasks",
    "workers.cli_runs",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tempered", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", help="TOML settings file (else $TEMPERED_CONFIG, tempered.toml)")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    sub.add_parser("up", help="start the embedded stack").set_defaults(func=_up)
    sub.add_parser("down", help="stop what `up` started").set_defaults(func=_down)
    sub.add_parser("status", help="stack, workers and live figures").set_defaults(func=_status)
    worker = sub.add_parser("worker", help="run the worker of a task queue")
    worker.add_argument("queue", choices=[q.value for q in Queue] + ["all"])
    worker.set_defaults(func=_worker)
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def _up(args: argparse.Namespace, settings: object) -> int:
    from infra import stack

    for line in stack.up(settings):  # type: ignore[arg-type]
        print(line)
    return 0


def _down(args: argparse.Namespace, settings: object) -> int:
    from infra import stack
    from workers.background import stop_workers

    for line in stop_workers(settings) + stack.down(settings):  # type: ignore[arg-type]
        print(line)
    return 0


def _status(args: argparse.Namespace, settings: object) -> int:
    from workers.cli_status import print_status

    return print_status(settings)  # type: ignore[arg-type]


def _worker(args: argparse.Namespace, settings: object) -> int:
    from workers.runtime import run_workers

    queues = list(Queue) if args.queue == "all" else [Queue(args.queue)]
    asyncio.run(run_workers(queues, settings))  # type: ignore[arg-type]
    return 0


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from infra.settings import load_settings

    try:
        settings = load_settings(args.config)
    except (ValidationError, FileNotFoundError, ValueError) as err:
        print(f"tempered: bad configuration: {err}", file=sys.stderr)
        return 2
    func: Callable[[argparse.Namespace, object], int] = args.func
    try:
        return func(args, settings)
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # one clear line, not a traceback wall (use -v for the traceback)
        if args.verbose:
            raise
        from workers.errors import describe

        print(f"tempered {args.command}: {describe(err)}", file=sys.stderr)
        return 1


def main() -> None:
    code = run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
