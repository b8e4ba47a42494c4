"""`tempered regrade RUN --grader v2 [--suite S]`: re-score a run's stored final programs, no
generation.

It re-scores each trajectory's final program against the task's tests *as the task suite
defines them now* (suite from `--suite`, else the run's `run.json`, else `starter`); the work is
`infra/regrade.py`'s, this module only finds the inputs and prints the outcome. A run without
run.json (a task started by hand, `temporal workflow start`) has its tasks looked up in
`starter`: where they are not there, the skip says to name their suite (`--suite FILE.jsonl`).

Exit codes (`EXIT`, the help's words too): 0 every trajectory regraded; 1 some were not: skipped
(each line says why), the sandbox kept failing, or a conflict (a stored verdict that differs
from today's is kept, never overwritten: `CONFLICTS`); 2: bad input, or the store failed:
verdicts written before it are kept; a rerun with the same --grader resumes (`KEPT`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import get_args

from rich.console import Console
from rich.table import Table

from contracts.common import is_identifier
from contracts.task import RewardConfig, SandboxLimits
from infra import keys
from infra.regrade import NOT_IN_SUITE, Regrading
from infra.sandbox import get_backend
from infra.settings import SandboxBackendName, Settings
from infra.storage import StorageError
from infra.tasks import load_suite
from workers.cli.errors import run_id
from workers.cli.runs import open_store, require_run, run_record, user_errors

CONFLICTS = "the suite changed since, or flaky tests; a new --grader name records new verdicts"
"""Why a regrade's verdict differs from the one its grader stored, which it keeps: the way out."""
KEPT = "verdicts written before it are kept; a rerun with the same --grader resumes"
"""What a regrade that stops at bad input or a store failure leaves (exit 2): records are
written create-only as it goes, and a rerun writes only the ones missing."""
NOT_REGRADED = 1
"""Exit code where some trajectories were not regraded (a conflict among them)."""
EXIT = (
    "Exit 0: every trajectory regraded; 1: some were not: skipped (each line says why), the "
    f"sandbox kept failing, or a stored verdict differs from today's and is kept ({CONFLICTS}); "
    f"2: bad input, or the store failed: {KEPT}."
)
"""The exit codes, as `--help` and the module docstring say them."""
COLUMNS = {
    "regraded": "regraded",
    "changed": "changed",
    "unchanged": "unchanged",
    "conflict": "conflicts",
    "skipped": "skipped",
    "infra": "infra",
}
"""The outcomes (`infra.regrade.OUTCOMES`) the table counts, each with its column's name."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `regrade` to the `tempered` CLI."""
    again = commands.add_parser("regrade", help="re-score a run's trajectories without generating")
    again.description = EXIT
    again.add_argument("run", type=run_id)
    again.add_argument("--grader", default="current", help="name of this grading (a key part)")
    again.add_argument(
        "--suite", default=None, help="task suite (default: the run's, else starter)"
    )
    again.add_argument("--backend", choices=get_args(SandboxBackendName), help="default: settings")
    again.set_defaults(func=regrade)


@user_errors
def regrade(args: argparse.Namespace, settings: Settings) -> int:
    grader: str = args.grader
    if not is_identifier(grader):
        raise ValueError(f"--grader {grader!r}: use letters, digits, '_', '.', '-'")
    store = open_store(settings)
    require_run(store, args.run)
    spec = run_record(store, args.run)
    suite = args.suite or (spec.suite if spec else "starter")
    tasks = {task.id: task for task in load_suite(suite)}
    if next(iter(store.list_keys(keys.trajectories_prefix(args.run))), None) is None:
        raise ValueError(f"run {args.run!r} has no trajectories to regrade")
    backend = get_backend(settings, args.backend)
    grading = Regrading(
        store,
        backend,
        grader,
        suite,
        limits=spec.limits if spec else SandboxLimits(),
        reward=spec.reward if spec else RewardConfig(),
        concurrency=settings.sandbox.concurrency,
        max_turns=spec.max_turns if spec else None,
    )

    async def regrade_all() -> dict[str, list[str]]:
        try:
            return await grading.run_stored(args.run, tasks)
        finally:
            await backend.close()

    try:
        outcome = asyncio.run(regrade_all())
    except (StorageError, ValueError) as exc:  # exit 2 (`user_errors`), some verdicts written
        where = f"s3://{store.bucket}/{keys.rewards_prefix(args.run, grader)}"
        raise ValueError(f"{exc}; {KEPT} (under {where})") from exc
    console = Console()
    table = Table(title=f"regrade of {args.run} by {grader!r} (suite {suite})")
    for column in COLUMNS.values():
        table.add_column(column, justify="right")
    table.add_row(*(str(len(outcome[k])) for k in COLUMNS))
    console.print(table)
    for kind in ("conflict", "skipped", "infra"):
        for line in outcome[kind]:
            console.print(f"[yellow]{kind}[/] {line}")
    if outcome[NOT_IN_SUITE] and args.suite is None:  # another suite may have those tasks
        print(
            f"tempered regrade: {_suite_hint(args.run, suite, known=spec is not None)}",
            file=sys.stderr,
        )
    if conflicts := len(outcome["conflict"]):
        print(
            f"tempered regrade: {conflicts} stored verdict(s) kept ({CONFLICTS})", file=sys.stderr
        )
    return NOT_REGRADED if outcome["skipped"] or outcome["infra"] or conflicts else 0


def _suite_hint(run: str, suite: str, known: bool) -> str:
    """The way out for trajectories skipped because their tasks are not in the suite `--suite`
    did not name (`NOT_IN_SUITE`): the run's (`known`: its run.json's), or `starter` for a run
    without run.json (started by hand)."""
    whose = f"run {run!r}'s suite" if known else f"the default: run {run!r} has no run.json"
    return (
        f"tasks were looked up in suite {suite!r} ({whose}); where the skipped ones are in "
        "another suite, name it: --suite FILE.jsonl (or harbor:DIR, or a built-in name)"
    )
