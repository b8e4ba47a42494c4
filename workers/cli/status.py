"""`tempered status`: what an operator looks for, readable in an 80-column terminal.

    tempered status          the services; per task queue, each worker process serving it (alive,
                             attempts in flight, finished per second, failed, last error) and its
                             backlog (tasks waiting, the oldest's age, added and dispatched per
                             second, pollers); per running training run its step, reward,
                             pass@1 and staleness
    tempered status --json   the same as raw figures: `infra.telemetry.read_live_figures` per
                             worker process and each run's `RunProgress`

Worker figures come from the workers' telemetry files under `<home>/telemetry/` (with an OTLP
collector configured there are none: the collector has them). Backlogs are Temporal's
(`workers.backlog`, DescribeTaskQueue). Runs are found by a visibility query for running
`TrainingRunWorkflow`s and read through their `progress` query; one that does not answer is
said why (`workers.cli.stalled`: pinned to a build no worker polls, no worker, …). Exit status:
0, or 1 when Temporal cannot be asked (what could be read is shown all the same): one line says
why, "cannot reach" (and `tempered up`) only where no Temporal answered, else what the one that
answered said (a namespace it lacks, a permission refused: `workers.cli.errors.describe`).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass

from pydantic import BaseModel, Field
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text
from temporalio.service import RPCError

from contracts.names import ACTIVITY_QUEUE, Queue
from infra import stack
from infra.settings import Settings
from infra.telemetry import read_live_figures
from infra.telemetry_figures import QueueFigures, WorkerFigures
from workers.background import background_workers
from workers.backlog import QueueBacklog, queue_backlogs
from workers.cli.errors import UNREACHABLE, describe
from workers.cli.progress import last_step, pass_at_1_text, reward_text
from workers.cli.stalled import silence_reason
from workers.runtime import TemporalUnreachable, connect
from workers.training import RunningRun, running_runs

CONNECT_TIMEOUT_S = 5.0
ACTIVITY_QUEUES = frozenset(ACTIVITY_QUEUE.values())
"""Queues whose workers run activities (agent-tasks runs workflows only: no attempt figures)."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    status = commands.add_parser("status", help="stack, workers by queue, running training runs")
    status.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    status.set_defaults(func=status_cmd)


class StatusReport(BaseModel):
    """Everything `tempered status` shows; `--json` prints it as is."""

    home: str
    services: dict[str, str] = Field(
        description="temporal, s3, codec → running (pid, address), stopped or external."
    )
    background_workers: dict[str, int] = Field(
        default={}, description="Queue → pid of the background worker `tempered train` started."
    )
    workers: dict[str, WorkerFigures] = Field(
        default={}, description="`<service>-<pid>` → figures from its telemetry file."
    )
    backlogs: list[QueueBacklog] | None = Field(
        default=None,
        description="Per task queue, its waiting tasks; None: Temporal is unreachable.",
    )
    runs: list[RunningRun] | None = Field(
        default=None, description="Running training runs; None when Temporal is unreachable."
    )
    silent: dict[str, str] = Field(
        default={},
        description="Run → why it did not answer its progress query (`workers.cli.stalled`).",
    )
    temporal: str = Field(description="Address of the Temporal frontend asked for runs.")
    temporal_external: bool = Field(
        default=False, description="Whether that Temporal is external (`temporal.embedded`)."
    )
    temporal_error: str | None = Field(default=None, description="Why it could not be asked.")
    temporal_unreachable: bool = Field(
        default=False,
        description="Whether no Temporal answered (else `temporal_error` is what it answered).",
    )


def status_cmd(args: argparse.Namespace, settings: Settings) -> int:
    report = asyncio.run(collect(settings))
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        render(report, Console())
    return 1 if report.temporal_error else 0


async def collect(settings: Settings) -> StatusReport:
    report = StatusReport(
        home=str(settings.home),
        temporal=settings.temporal.address,
        temporal_external=not settings.temporal.embedded,
        services=stack.status(settings),
        background_workers={
            queue.value: pid for queue, pid in background_workers(settings).items()
        },
        workers=read_live_figures(settings),
    )
    try:
        client = await asyncio.wait_for(connect(settings), CONNECT_TIMEOUT_S)
        report.backlogs = await queue_backlogs(client)
        report.runs = await running_runs(client)
        report.silent = {
            run.run_id: await silence_reason(client, run.run_id, run.workflow_id)
            for run in report.runs
            if run.progress is None
        }
    except (RuntimeError, OSError, TimeoutError, RPCError) as exc:  # refused, unreachable, …
        report.temporal_unreachable = _unreachable(exc)
        report.temporal_error = (
            str(exc) or type(exc).__name__ if report.temporal_unreachable else describe(exc)
        )
    return report


def _unreachable(exc: BaseException) -> bool:
    """Whether `exc` says no Temporal answered (refused, no route, silent, gone), not that one
    answered with an error (a namespace it lacks, a permission refused)."""
    if isinstance(exc, RPCError):
        return exc.status in UNREACHABLE
    return isinstance(exc, (TemporalUnreachable, OSError, TimeoutError))


# ---- rendering ----------------------------------------------------------------------------


@dataclass
class WorkerRow:
    queue: str
    pid: int | None
    state: str
    figures: QueueFigures | None


def worker_rows(report: StatusReport) -> list[WorkerRow]:
    """One row per worker process of each queue (a process serving several has several rows);
    a queue nobody serves gets a row saying so."""
    rows: list[WorkerRow] = []
    for queue in Queue:
        serving = [w for w in report.workers.values() if queue.value in w.queue_names]
        for worker in sorted(serving, key=lambda w: (not w.live, not w.alive, w.pid)):
            state = "up" if worker.live else "stale" if worker.alive else "exited"
            idle = QueueFigures() if worker.live and queue in ACTIVITY_QUEUES else None
            rows.append(WorkerRow(queue, worker.pid, state, worker.queues.get(queue.value, idle)))
        background = report.background_workers.get(queue.value)
        if background is not None and all(w.pid != background for w in serving):
            rows.append(WorkerRow(queue, background, "starting", None))  # no telemetry yet
        if not any(row.queue == queue and row.state != "exited" for row in rows):
            rows.append(WorkerRow(queue, None, "none", None))
    return rows


def render(report: StatusReport, console: Console, now: float | None = None) -> None:
    now = time.time() if now is None else now
    services = _table("stack")
    services.show_header = False
    services.add_column(style="bold")
    services.add_column(overflow="fold")
    for name, state in {"home": report.home, **report.services}.items():
        services.add_row(name, state)
    console.print(services)
    rows = worker_rows(report)
    console.print(_workers_table(rows, now))
    if report.backlogs is not None:
        console.print(_backlog_table(report.backlogs))
    for row in rows:
        if row.figures is not None and row.figures.last_error:
            when = _ago(row.figures.last_error_at, now)
            line = Text(f"{row.queue} (pid {row.pid}) {when}: ", style="yellow")
            line.append(row.figures.last_error, style="default")
            console.print(line)
    if report.runs is None and report.temporal_error and not report.temporal_unreachable:
        console.print(Text(f"training runs: {report.temporal_error}", style="red"))
    elif report.runs is None:
        hint = "(external)" if report.temporal_external else "(`tempered up`?)"
        reason = f"training runs: cannot reach Temporal at {report.temporal} {hint}"
        console.print(Text(reason, style="red"))
    elif not report.runs:
        console.print("no training run is running")
    else:
        console.print(_runs_table(report.runs))
        for run in report.runs:
            if run.progress is None:
                silent = report.silent.get(run.run_id) or (
                    f"{run.run_id}: no answer to the progress query (no agent-tasks worker?)"
                )
                console.print(Text(silent, style="yellow"))


_STATE_STYLE = {
    "up": "green",
    "starting": "cyan",
    "stale": "yellow",
    "exited": "red",
    "none": "red",
}


def _workers_table(rows: list[WorkerRow], now: float) -> Table:
    table = _table("workers")
    table.add_column("queue", no_wrap=True)
    table.add_column("pid", justify="right", no_wrap=True)
    table.add_column("alive", no_wrap=True)
    for name in ("in flight", "done/s", "failed", "cancelled", "last error"):
        table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        state = Text(row.state, style=_STATE_STYLE[row.state])
        pid = str(row.pid) if row.pid is not None else "-"
        figures = row.figures
        if figures is None:
            table.add_row(row.queue, pid, state, "-", "-", "-", "-", "-")
            continue
        table.add_row(
            row.queue,
            pid,
            state,
            str(figures.in_flight),
            _number(figures.per_s),
            str(figures.failed),
            str(figures.cancelled),
            _ago(figures.last_error_at, now),
        )
    return table


def _backlog_table(backlogs: list[QueueBacklog]) -> Table:
    table = _table("task queues")
    table.caption = "waiting: tasks no worker has taken yet (workflow tasks on agent-tasks)"
    table.add_column("queue", no_wrap=True)
    for name in ("waiting", "oldest", "added/s", "taken/s", "pollers"):
        table.add_column(name, justify="right", no_wrap=True)
    for backlog in backlogs:
        table.add_row(
            backlog.queue,
            str(backlog.backlog),
            f"{backlog.oldest_s:.0f}s" if backlog.backlog else "-",
            _number(backlog.added_per_s),
            _number(backlog.dispatched_per_s),
            str(backlog.pollers),
        )
    return table


def _runs_table(runs: list[RunningRun]) -> Table:
    table = _table("training runs")
    table.caption = "tasks: done/started; stale: versions the learner's last batch lagged"
    table.add_column("run", overflow="fold")
    for name in ("step", "tasks", "in flight", "reward", "held-out", "stale"):
        table.add_column(name, justify="right", no_wrap=True)
    for run in runs:
        progress = run.progress
        if progress is None:
            table.add_row(run.run_id, "?", *["-"] * 5)
            continue
        last = last_step(progress)
        table.add_row(
            run.run_id + (" (stopping)" if progress.stopping else ""),
            str(last.step) if last else "0",
            f"{progress.tasks_done}/{progress.tasks_started}",
            str(progress.in_flight),
            reward_text(last),
            pass_at_1_text(progress.evals),
            str(last.staleness) if last else "-",
        )
    return table


def _table(title: str) -> Table:
    """Two spaces between columns, a rule under the header: the most text in 80 columns."""
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        collapse_padding=True,
    )


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _ago(at: float | None, now: float) -> str:
    if at is None:
        return "-"
    seconds = max(now - at, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"
