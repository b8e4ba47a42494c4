"""`tempered up`, `tempered down`, `tempered worker QUEUE|all`: the embedded stack and workers.

    tempered up                  Temporal dev server (+ UI) and SeaweedFS S3, in the background
                                 (an external Temporal or S3 is used as it is, never started)
    tempered down [--force]      stop them, and the background workers `tempered train` started
                                 (while a training run runs, only with --force: it waits, and
                                 goes on after `up`; `train --attach RUN` follows it again;
                                 also only with --force while the stack's own Temporal runs
                                 and cannot say which runs run: one may)
    tempered worker sandbox      run one queue's worker in the foreground (`all`: every queue)

What `up` starts and on which ports is `infra.stack`'s (`up --help` lists the settings that
move it off taken ports); how a worker runs is `workers.runtime`'s.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys

from temporalio.client import Client
from temporalio.service import RPCError

from contracts.names import Queue, SearchAttr, Workflow
from infra import stack
from infra.processes import limit_openmp_spin, port_open
from infra.settings import S3Settings, Settings, TemporalSettings
from workers.background import stop_workers
from workers.cli.errors import describe
from workers.runtime import connect, quiet_runtime, run_workers
from workflows.search import KEYS

ASK_S = 10.0
"""How long `down` waits for Temporal to say which runs run, to connect and again to list."""
GRPC_PROBE_S = 1.0
"""How long Temporal's port may take to answer HTTP/2's preface (`_speaks_grpc`) before `down`
asks it: the SDK's connect to a process that holds the port and never answers waits out ASK_S
(its own timeout is 30 s). Not asked of the stack's own Temporal (its pidfile's process), which
a loaded host may keep from answering that soon: one that does not answer within ASK_S (or
fails the query) may have a run running, and `down` stops it only with --force (`Unasked`)."""
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""A client's connection preface, then an empty SETTINGS frame (length 0, type 4, stream 0)."""

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
    stopping = commands.add_parser(
        "down",
        help="stop what `up` started, and background workers",
        description="Stop what `up` started and the background workers. While a training run "
        "runs it stops nothing unless --force: the run waits until the stack is up again.",
    )
    stopping.add_argument(
        "--force", action="store_true", help="stop them even while training runs run"
    )
    stopping.set_defaults(func=down)
    running = commands.add_parser("worker", help="run the worker of a task queue")
    running.add_argument("queue", choices=[q.value for q in Queue] + ["all"])
    running.set_defaults(func=worker)


class Unasked(Exception):
    """The stack's own Temporal runs and did not say which runs run (why: the exception's text):
    one may, as where it said so."""


def up(args: argparse.Namespace, settings: Settings) -> int:
    """Each service's line as it comes (a failure after a start leaves that start said)."""
    stack.up(settings, say=lambda line: print(line, flush=True))
    return 0


def down(args: argparse.Namespace, settings: Settings) -> int:
    """Stop the workers and the stack; while training runs run, or the stack's own Temporal
    cannot say whether any does, only with `--force` (exit 2)."""
    try:
        running = asyncio.run(_running_runs(settings))
    except Unasked as exc:
        said = (
            f"could not ask the stack's Temporal ({settings.temporal.address}) which training "
            f"runs run ({exc}): one may"
        )
        if not args.force:
            print(
                f"tempered down: {said}. Nothing stopped: `tempered down --force` stops the "
                "stack all the same (a run waits while it is down and goes on after `up`)",
                file=sys.stderr,
            )
            return 2
        print(f"tempered down: {said}; stopping all the same (--force)", file=sys.stderr)
        running = []
    if running:
        runs = "s still run" if len(running) > 1 else " still runs"
        attach = "; ".join(f"tempered train --attach {run}" for run in running)
        said = (
            f"{len(running)} training run{runs}: {', '.join(running)}. A run waits while the "
            "stack is down and goes on after `tempered up` (a `tempered train` following it "
            f"detaches); follow it again with {attach}"
        )
        if not args.force:
            print(
                f"tempered down: {said}. Nothing stopped: `tempered down --force` stops the "
                "stack all the same (or `tempered stop RUN` first)",
                file=sys.stderr,
            )
            return 2
        print(f"tempered down: {said}", file=sys.stderr)
    for line in stop_workers(settings) + stack.down(settings):
        print(line)
    return 0


async def _running_runs(settings: Settings) -> list[str]:
    """The ids of the training runs that run on the settings' Temporal; none when nothing
    answers there (a stack that is down), or when a Temporal not the stack's own cannot be
    asked (said on stderr: one that is not Temporal, an external one down). `Unasked` when the
    stack's own runs and cannot be asked (a loaded host's may answer late)."""
    endpoint = stack.temporal_endpoint(settings)
    if not port_open(endpoint.host, endpoint.port):
        return []
    ours = stack.temporal_service(settings).pid() is not None  # a loaded one may answer late
    if not ours and not await asyncio.to_thread(
        _speaks_grpc, endpoint.host, endpoint.port, GRPC_PROBE_S
    ):
        print(
            f"tempered down: cannot tell which runs run ({endpoint} does not answer as a gRPC "
            f"server within {GRPC_PROBE_S:.0f}s: not Temporal)",
            file=sys.stderr,
        )
        return []
    try:
        client = await asyncio.wait_for(connect(settings, runtime=quiet_runtime()), ASK_S)
        return await asyncio.wait_for(running_run_ids(client), ASK_S)
    except (RuntimeError, OSError, TimeoutError, RPCError) as exc:
        why = f"no answer within {ASK_S:.0f}s" if isinstance(exc, TimeoutError) else describe(exc)
        if ours:
            raise Unasked(why) from None
        print(f"tempered down: cannot tell which runs run ({why})", file=sys.stderr)
        return []


def _speaks_grpc(host: str, port: int, timeout_s: float) -> bool:
    """Whether host:port answers HTTP/2's connection preface with a SETTINGS frame within
    `timeout_s`, as any gRPC server does at once (one that holds the port and never answers,
    or answers HTTP/1, does not)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.sendall(HTTP2_PREFACE)
            header = conn.recv(9, socket.MSG_WAITALL)  # the first frame's header
    except OSError:  # refused, reset, timed out
        return False
    return len(header) == 9 and header[3] == 4


async def running_run_ids(client: Client) -> list[str]:
    """Every running TrainingRunWorkflow's run id (its TemperedRunId), by a visibility query."""
    query = f'WorkflowType = "{Workflow.TRAINING_RUN.value}" AND ExecutionStatus = "Running"'
    return sorted(
        [
            execution.typed_search_attributes.get(KEYS[SearchAttr.RUN_ID]) or execution.id
            async for execution in client.list_workflows(query)
        ]
    )


def worker(args: argparse.Namespace, settings: Settings) -> int:
    queues = list(Queue) if args.queue == "all" else [Queue(args.queue)]
    limit_openmp_spin(settings.omp_spin_count)  # before the workers import torch
    asyncio.run(run_workers(queues, settings))
    return 0
