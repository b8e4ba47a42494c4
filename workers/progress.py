"""Live progress of a training run in the terminal (polls the workflow's `progress` query)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from temporalio.client import WorkflowHandle

from contracts.learner import TrainingRunInput, TrainingRunResult

POLL_S = 2.0


async def follow(handle: WorkflowHandle[Any, TrainingRunResult], run_input: TrainingRunInput) -> TrainingRunResult:
    """Render progress until the run ends; return its result."""
    result_task = asyncio.ensure_future(handle.result())
    started = time.monotonic()
    console = Console()
    with Live(console=console, refresh_per_second=2, transient=not console.is_terminal) as live:
        while not result_task.done():
            try:
                progress = await handle.query("progress")
            except Exception:  # not queryable yet (first task not run): keep waiting
                progress = {}
            live.update(_table(progress, run_input, time.monotonic() - started))
            await asyncio.wait([result_task], timeout=POLL_S)
    result = result_task.result()
    console.print(_summary(result, time.monotonic() - started))
    return result


def _table(progress: dict[str, Any], run_input: TrainingRunInput, elapsed: float) -> Table:
    table = Table(title=f"{run_input.run_id}: {run_input.base_model} on {run_input.suite}")
    for column in ("elapsed", "step", "policy", "tasks done", "in flight", "reward", "pass@1", "staleness"):
        table.add_column(column, justify="right")
    steps = progress.get("learner", [])
    evals = progress.get("evals", [])
    last = steps[-1] if steps else {}
    table.add_row(
        f"{elapsed:.0f}s",
        f"{last.get('step', 0)}/{run_input.steps}",
        f"v{last.get('policy_version', 0)}",
        str(progress.get("tasks_done", 0)),
        str(progress.get("in_flight", 0)),
        _fmt(last.get("reward_mean")),
        " ".join(f"v{e['policy_version']}:{e['pass_at_1']:.2f}" for e in evals) or "-",
        _fmt(last.get("staleness")),
    )
    return table


def _summary(result: TrainingRunResult, elapsed: float) -> str:
    evals = ", ".join(f"v{e.policy_version} {e.pass_at_1:.3f}" for e in result.evals)
    return (
        f"run {result.run_id} finished in {elapsed:.0f}s: {result.steps} steps, "
        f"{result.tasks_done}/{result.tasks_started} tasks; held-out pass@1: {evals or 'n/a'}"
    )


def _fmt(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else "-"
