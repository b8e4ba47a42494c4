"""`tempered tasks ...`: list task suites and validate them through the sandbox.

    tempered tasks ls starter --split heldout
    tempered tasks validate humaneval --repeats 5 --concurrency 8 [--backend gvisor] [--json]
    tempered tasks validate harbor:examples/harbor     # workspace suites: solve.sh K times

`validate` exits 0 when every task is clean, 1 when it quarantined tasks (broken, flaky or
weak tests), 2 when some runs kept failing for platform reasons (infra) or the input was bad.
A quarantine list that cannot be read is named before any run starts: a validation of the whole
suite writes a new one over it, a partial one (`--split`, `--limit`) is refused.
The verdicts and the quarantine file are `infra.tasks.validate`'s; this module prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import get_args

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from contracts.task import SandboxLimits
from infra.settings import SandboxBackendName, Settings
from infra.tasks import SPLITS, SUITE_HELP, is_workspace_suite, load_suite
from infra.tasks.validate import (
    VALIDATION_LIMITS,
    CheckPlan,
    ValidationReport,
    read_quarantine,
    validate_suite,
    write_quarantine,
)
from infra.tasks.workspace_validate import validate_workspace_suite
from workers.cli.errors import describe, number, positive

VERDICT_STYLE = {
    "clean": "green",
    "broken": "red",
    "flaky": "yellow",
    "weak": "magenta",
    "infra": "cyan",
}


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tasks = commands.add_parser("tasks", help="list and validate task suites")
    actions = tasks.add_subparsers(dest="tasks_command", required=True, metavar="COMMAND")

    listing = actions.add_parser("ls", help="list a suite's task ids and splits")
    listing.add_argument("suite", help=SUITE_HELP)
    listing.add_argument("--split", choices=SPLITS, default=None)
    listing.add_argument("--json", action="store_true", help="print JSON lines")
    listing.set_defaults(func=list_tasks)

    check = actions.add_parser("validate", help="run canonical/wrong solutions; write quarantine")
    check.add_argument("suite", help=SUITE_HELP)
    check.add_argument("--repeats", type=positive, default=5, help="canonical runs per task (K)")
    check.add_argument(
        "--concurrency",
        type=positive,
        default=None,
        help="sandbox runs in flight (C; default: settings.sandbox.concurrency)",
    )
    check.add_argument("--backend", choices=get_args(SandboxBackendName), help="default: settings")
    check.add_argument("--split", choices=SPLITS, default=None)
    check.add_argument("--limit", type=positive, default=None, help="only the first N tasks")
    check.add_argument("--timeout", type=number, default=None, help="per-run wall limit, seconds")
    check.add_argument("--json", action="store_true", help="print the full report as JSON")
    check.set_defaults(func=validate)


def bad_input(exc: ValueError) -> int:
    """One line on stderr (rich wrapped it at the terminal's width, on stdout), exit 2."""
    print(f"tempered tasks: {describe(exc)}", file=sys.stderr)
    return 2


def list_tasks(args: argparse.Namespace, settings: Settings) -> int:
    console = Console()
    try:
        tasks = load_suite(args.suite, split=args.split)
    except ValueError as exc:
        return bad_input(exc)
    if args.json:
        for task in tasks:
            print(json.dumps({"id": task.id, "split": task.split, "entry_point": task.entry_point}))
        return 0
    table = Table(title=f"{args.suite}: {len(tasks)} tasks")
    for column in ("id", "split", "entry_point"):
        table.add_column(column)
    for task in tasks:
        table.add_row(task.id, task.split, task.entry_point)
    console.print(table)
    return 0


def validate(args: argparse.Namespace, settings: Settings) -> int:
    console = Console(stderr=args.json)
    limits = VALIDATION_LIMITS
    concurrency = args.concurrency or settings.sandbox.concurrency
    try:
        # within SandboxLimits' bounds: `--timeout 0` timed every run out and quarantined the
        # whole suite (which training then skipped)
        if args.timeout is not None:
            limits = SandboxLimits.model_validate(limits.model_dump() | {"timeout_s": args.timeout})
        unreadable = previous_list_problem(settings, args)
        total = len(load_suite(args.suite, split=args.split)[: args.limit])
        with Progress(
            TextColumn("validating {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            bar = progress.add_task(args.suite, total=total * (args.repeats + 1))
            validator = (
                validate_workspace_suite if is_workspace_suite(args.suite) else validate_suite
            )
            report = asyncio.run(
                validator(
                    settings,
                    args.suite,
                    CheckPlan(args.repeats, concurrency, limits, lambda: progress.advance(bar)),
                    backend_name=args.backend,
                    split=args.split,
                    limit=args.limit,
                )
            )
    except ValueError as exc:  # pydantic's ValidationError too
        return bad_input(exc)
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        print_summary(console, report)
    try:  # the report is out first: a list that cannot be written loses no result
        path = write_quarantine(settings, report, replace=unreadable is not None)
    except (OSError, ValueError) as exc:
        print(f"tempered tasks: quarantine list not written: {describe(exc)}", file=sys.stderr)
        return 2
    if unreadable is not None:
        note = f"{unreadable}: replaced by this validation of the whole suite"
        console.print(note, markup=False, highlight=False, soft_wrap=True)
    if not args.json:
        console.print(f"quarantine list: {path}")
    if report.ids("infra"):
        return 2
    return 1 if report.quarantined else 0


def previous_list_problem(settings: Settings, args: argparse.Namespace) -> str | None:
    """Why the suite's quarantine list cannot be read (None when it can or there is none),
    checked before any run starts. A validation of the whole suite writes a new list over it;
    a partial one (`--split`, `--limit`) must keep its other entries, so ValueError naming the
    file: it failed after every run, results lost, and `train`'s advice to rerun `tasks
    validate` led back to it."""
    try:
        read_quarantine(settings, args.suite)
    except ValueError as exc:
        if args.split is not None or args.limit is not None:
            raise ValueError(
                f"{exc}; fix or remove it, or validate the whole suite (no --split or --limit) "
                "to write a new one"
            ) from None
        return str(exc)
    return None


def print_summary(console: Console, report: ValidationReport) -> None:
    """One row per verdict, then one row per task that is not clean."""
    summary = Table(
        title=f"{report.suite}: {len(report.tasks)} tasks",
        min_width=40,
        caption=f"K={report.repeats} C={report.concurrency} backend={report.backend}",
    )
    summary.add_column("verdict")
    summary.add_column("tasks", justify="right")
    for verdict, style in VERDICT_STYLE.items():
        summary.add_row(f"[{style}]{verdict}[/]", str(len(report.ids(verdict))))
    if report.unjudged:  # no solution or trees here to judge them by: never quarantined
        summary.add_row("unjudged (not validated)", str(len(report.unjudged)))
    console.print(summary)
    problems = [task for task in report.tasks if task.verdict != "clean"]
    if problems:
        detail = Table(title="tasks needing attention")
        for column in ("task", "verdict", "canonical runs", "wrong run", "detail"):
            detail.add_column(column, overflow="fold")
        for task in problems:
            runs = ", ".join(str(run.status) if run.status else "infra" for run in task.canonical)
            wrong = str(task.wrong.status) if task.wrong and task.wrong.status else "-"
            first = next((run.detail for run in task.canonical if run.detail), "")
            verdict = f"[{VERDICT_STYLE[task.verdict]}]{task.verdict}[/]"
            detail.add_row(task.task_id, verdict, runs, wrong, first[-200:])
        console.print(detail)
    slowest_ms, slowest_task = max(
        ((run.duration_ms, task.task_id) for task in report.tasks for run in task.canonical),
        default=(0, "-"),
    )
    console.print(
        f"{report.runs} runs in {report.wall_s:.1f} s wall "
        f"({report.runs / max(report.wall_s, 1e-9):.1f} runs/s); slowest canonical run "
        f"{slowest_ms} ms ({slowest_task}); infra retries {report.infra_retries}; "
        f"quarantined {len(report.quarantined)}"
    )
