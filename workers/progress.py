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
from infra.settings import Settings

POLL_S = 2.0


async def follow(
    handle: WorkflowHandle[Any, TrainingRunResult], run_input: TrainingRunInput, settings: Settings
) -> TrainingRunResult:
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
            live.update(
                _table(progress, run_input, time.monotonic() - started, _worker_figures(settings))
            )
            await asyncio.wait([result_task], timeout=POLL_S)
    result = result_task.result()
    console.print(_summary(result, time.monotonic() - started))
    return result


def _worker_figures(settings: Settings) -> dict[str, float]:
    """Live inference tokens/s and sandbox runs from the workers' telemetry files."""
    from infra.telemetry import read_live_figures

    alive = [row for row in read_live_figures(settings).values() if row.get("alive")]
    return {
        "tokens_per_s": sum(row.get("tokens_per_s") or 0.0 for row in alive),
        "sandbox_runs": sum(sum((row.get("sandbox_runs") or {}).values()) for row in alive),
    }


def _table(
    progress: dict[str, Any], run_input: TrainingRunInput, elapsed: float, figures: dict[str, float]
) -> Table:
    table = Table(title=f"{run_input.run_id}: {run_input.base_model} on {run_input.suite}")
    columns = ("elapsed", "step", "policy", "tasks done", "in flight", "reward", "pass@1",
               "staleness", "tok/s", "sandbox runs/s")  # fmt: skip
    for column in columns:
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
        str(last.get("staleness", "-")),
        f"{figures['tokens_per_s']:.0f}",
        f"{figures['sandbox_runs'] / max(elapsed, 1e-9):.1f}",
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
