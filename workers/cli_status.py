"""`tempered status`: the stack, the workers, and live figures from their telemetry files."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from infra import stack
from infra.settings import Settings
from workers.background import worker_status


def print_status(settings: Settings) -> int:
    console = Console()
    table = Table(title=f"Tempered stack ({settings.home})", show_header=False)
    for name, state in {**stack.status(settings), **worker_status(settings)}.items():
        table.add_row(name, state)
    console.print(table)
    try:
        from infra.telemetry import read_live_figures
    except ImportError:
        return 0
    figures = read_live_figures(settings)
    if figures:
        live = Table(title="Live figures (from worker telemetry)")
        columns = sorted({key for row in figures.values() for key in row})
        live.add_column("worker")
        for column in columns:
            live.add_column(column, justify="right")
        for worker, row in sorted(figures.items()):
            live.add_row(worker, *(_fmt(row.get(c)) for c in columns))
        console.print(live)
    return 0


def _fmt(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)
