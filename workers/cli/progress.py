"""Live progress of a training run in the terminal (`tempered train`), and the few phrases
`tempered status` shares with it (step, reward, pass@1 of a `RunProgress`, or the solve rate
where pass@1 is 0 by construction: `EvalResult.by_solve_rate`). Besides the run's
own figures it shows every task queue's backlog (`workers.backlog`), so a queue whose workers
cannot keep up is named while it happens; a run that stops answering is said why, once per
cause (`workers.cli.stalled`)."""

from __future__ import annotations

import asyncio
import time
from typing import NamedTuple

from rich.console import Console
from rich.live import Live
from rich.table import Table
from temporalio.client import Client
from temporalio.service import RPCError

from contracts.evaluation import EvalResult
from contracts.learner import LearnerProgress
from contracts.run import RunProgress, TrainingRunInput, TrainingRunResult
from infra.settings import Settings
from infra.telemetry import read_live_figures
from workers.backlog import QueueBacklog, backlog_text, queue_backlogs
from workers.cli.report import before_after, figure_label, figure_of, gain_points
from workers.cli.stalled import Silence
from workers.training import RunHandle, watch

LOG_EVERY_S = 15.0
"""Off a terminal, the most often a progress line is printed (a learner step prints at once)."""
ALIVE_S = 60.0
"""Off a terminal, the longest it stays silent: the line is printed again, unchanged."""


async def follow(
    client: Client,
    handle: RunHandle,
    run_input: TrainingRunInput,
    settings: Settings,
    started: float,
) -> TrainingRunResult:
    """Render progress until the run ends (a live table on a terminal, else a plain line when
    a figure changes, at most every `LOG_EVERY_S` unless the learner stepped, and at least
    every `ALIVE_S`); return its result. `started` is when the run began (Unix seconds), so an
    `--attach` shows the run's elapsed time, not the time since following began; the closing
    `summary` is the caller's to print, with the wall time its report gives."""
    result = asyncio.ensure_future(handle.result())
    console = Console()
    latest = RunProgress()
    silence, said = Silence(client, run_input.run_id, handle.id), set[tuple[str, ...]]()
    if console.is_terminal:
        with Live(console=console, refresh_per_second=2) as live:
            async for progress in watch(handle, result):
                latest = progress or latest  # not queryable yet (no task run): keep the last
                if (reason := await silence.reason(progress)) and silence.cause not in said:
                    said.add(silence.cause or ())
                    live.console.print(reason, style="yellow", markup=False)
                backlogs = await _backlogs(client)
                live.update(view(run_input, latest, time.time() - started, settings, backlogs))
    else:  # a log file or a pipe: lines that read in order, no redraws
        printed, printed_at, printed_step = "", -ALIVE_S, None
        async for progress in watch(handle, result):
            latest, elapsed = progress or latest, time.time() - started
            if (reason := await silence.reason(progress)) and silence.cause not in said:
                said.add(silence.cause or ())
                print(f"[{elapsed:5.0f} s] {reason}", flush=True)
            line, step = progress_line(run_input, latest), last_step(latest)
            quiet_s = elapsed - printed_at
            changed = line != printed and (step != printed_step or quiet_s >= LOG_EVERY_S)
            if changed or quiet_s >= ALIVE_S:
                print(f"[{elapsed:5.0f} s] {line}", flush=True)
                printed, printed_at, printed_step = line, elapsed, step
    return result.result()


def progress_line(run_input: TrainingRunInput, progress: RunProgress) -> str:
    """`step 2/6 v2 | tasks 9 done, 8 in flight | reward +0.150 | pass@1 v0 0.40 / 0.40`."""
    last = last_step(progress)
    step, version = (last.step, last.policy_version) if last else (0, 0)
    evals = "  ".join(eval_text(e) for e in progress.evals) or "-"
    stopping = f" | stopping ({progress.stopping})" if progress.stopping else ""
    redrawn = f", {progress.redrawn} flat" if progress.redrawn else ""
    return (
        f"step {step}/{run_input.steps} v{version} | tasks {progress.tasks_done} done, "
        f"{progress.in_flight} in flight{redrawn} | reward {reward_text(last)} | "
        f"{figure_name(progress.evals)} {evals}{stopping}"
    )


def view(
    run_input: TrainingRunInput,
    progress: RunProgress,
    elapsed: float,
    settings: Settings,
    backlogs: list[QueueBacklog] | None = None,
) -> Table:
    """One figure per line, so it reads at any terminal width."""
    tokens_per_s, sandbox_runs_per_s = _worker_figures(settings)
    grid = Table.grid(padding=(0, 2))
    grid.title = f"{run_input.run_id}: {run_input.base_model} on {run_input.suite}"
    grid.title_justify = "left"
    grid.add_column(style="bold")
    grid.add_column()
    last = last_step(progress)
    step, version = (last.step, last.policy_version) if last else (0, 0)
    evals = "  ".join(eval_text(e) for e in progress.evals)
    rows = {
        "elapsed": f"{elapsed:.0f} s",
        "step": f"{step}/{run_input.steps}, policy v{version}",
        "tasks": f"{progress.tasks_done} done, {progress.in_flight} in flight, "
        f"{progress.tasks_started} started"
        + (f", {progress.redrawn} flat redrawn" if progress.redrawn else "")
        + (f"; stopping ({progress.stopping}): no new ones" if progress.stopping else ""),
        # flat groups redrawn never reach the learner: not every rollout's mean
        "reward": reward_text(last)
        + (f" (mean of the groups sent to step {step})" if last else ""),
        "staleness": str(last.staleness) if last else "-",
        figure_name(progress.evals): evals or "-",
        "inference": rate_text(tokens_per_s, "{:.0f} tokens/s"),
        "sandbox": rate_text(sandbox_runs_per_s, "{:.1f} runs/s"),
        "waiting": backlog_text(backlogs) if backlogs is not None else "-",
    }
    for name, value in rows.items():
        grid.add_row(name, value)
    return grid


def last_step(progress: RunProgress) -> LearnerProgress | None:
    return progress.learner[-1] if progress.learner else None


def reward_text(step: LearnerProgress | None) -> str:
    """Mean reward of the groups sent to the latest learner step (trained or not)."""
    return f"{step.reward_mean:+.3f}" if step else "-"


def pass_at_1_text(evals: list[EvalResult]) -> str:
    """The newest held-out pass@1 and the policy version it measured, or its solve rate
    (`0.75 (v8, solved within 4 turns)`) where pass@1 is 0 by construction."""
    if not evals:
        return "-"
    newest = max(evals, key=lambda e: e.policy_version)
    if newest.by_solve_rate and newest.solve_rate is not None:
        within = f"solved within {newest.turns} turns"
        return f"{newest.solve_rate:.2f} (v{newest.policy_version}, {within})"
    return f"{newest.pass_at_1:.2f} (v{newest.policy_version})"


def figure_name(evals: list[EvalResult]) -> str:
    """What the progress line and the table call the evaluations' figures."""
    if figure_of(evals) == "solve_rate":
        return f"solved within {max(e.turns for e in evals)} turns"
    return "pass@1"


def eval_text(evaluation: EvalResult) -> str:
    """`v3 16/80 (0.20)` (tasks solved at turn 1, pass@1), or `v3 16/80 (0.20) / 28/80 (0.35)`
    with those solved within T turns: the count says how coarse the figure is. Where pass@1 is
    0 by construction (`by_solve_rate`), those solved within T turns alone."""
    if evaluation.by_solve_rate and evaluation.solve_rate is not None:
        return f"v{evaluation.policy_version} {_share(evaluation.solve_rate, evaluation.tasks)}"
    text = f"v{evaluation.policy_version} {_share(evaluation.pass_at_1, evaluation.tasks)}"
    if evaluation.turns > 1 and evaluation.solve_rate is not None:
        text += f" / {_share(evaluation.solve_rate, evaluation.tasks)}"
    return text


def _share(rate: float, tasks: int) -> str:
    return f"{round(rate * tasks)}/{tasks} ({rate:.2f})"


def eval_label(evals: list[EvalResult]) -> str:
    turns = max((e.turns for e in evals), default=1)
    if figure_of(evals) == "solve_rate":
        return figure_label("solve_rate", turns)
    return "held-out pass@1" + (f" / solved within {turns} turns" if turns > 1 else "")


def gain_text(evals: list[EvalResult]) -> str:
    """The last evaluation's gain over the first (report.json's `headline`): `, +12.5 points`
    (pass@1, one turn, or the solve rate where pass@1 is 0 by construction: the label says
    which), `, +7.5 points at turn 1, +10 points solved within 2 turns` (pass@1 first, then
    the solve rate, where the episodes had more turns), or that no trained version was
    evaluated (the report's `pass_at_1_after` is null then)."""
    before, after = before_after(evals)
    if before is None:
        return ""
    if after is None:
        return "; no trained version evaluated"
    figure = figure_of(evals)
    text = f", {gain_points(before, after, figure) or 0:+g} points"  # the figure: each has it
    if figure == "solve_rate" or after.turns == 1:
        return text
    within = gain_points(before, after, "solve_rate")
    solved = f", {within:+g} points solved within {after.turns} turns" if within is not None else ""
    return f"{text} at turn 1{solved}"


def summary(result: TrainingRunResult, elapsed: float) -> str:
    """The closing line; `elapsed` is the run's wall time, as its report has it."""
    evals = sorted(result.evals, key=lambda e: e.policy_version)
    shown = ", ".join(eval_text(e) for e in evals)
    stopped = f" (stopped: {result.stopped})" if result.stopped else ""
    return (
        f"run {result.run_id} finished in {elapsed:.0f}s{stopped}: {result.steps} steps, "
        f"{result.tasks_done}/{result.tasks_started} tasks"
        f"{f' ({result.redrawn} flat groups redrawn)' if result.redrawn else ''}; "
        f"{eval_label(evals)}: "
        f"{shown or 'n/a'}{gain_text(evals)}"
    )


async def _backlogs(client: Client) -> list[QueueBacklog] | None:
    """Every queue's backlog; None when Temporal does not say (the figures are optional)."""
    try:
        return await queue_backlogs(client)
    except RPCError:
        return None


class Total(NamedTuple):
    """A rate summed over the live workers: `value` of those that give one, `missing` of `of`
    that give none (one snapshot yet, a counter that went back)."""

    value: float
    missing: int
    of: int


def _worker_figures(settings: Settings) -> tuple[Total | None, Total | None]:
    """(inference tokens/s, sandbox runs/s) of the live workers, from their telemetry files here;
    None where no worker gives the figure (none writes here: an OTLP collector has their
    telemetry, or they run on another machine), which is not 0."""
    live = [worker for worker in read_live_figures(settings).values() if worker.live]
    return (
        _sum([worker.tokens_per_s for worker in live]),
        _sum([worker.sandbox_runs_per_s for worker in live]),
    )


def _sum(figures: list[float | None]) -> Total | None:
    known = [figure for figure in figures if figure is not None]
    return Total(sum(known), len(figures) - len(known), len(figures)) if known else None


def rate_text(total: Total | None, form: str) -> str:
    """`5.0 runs/s`; `at least 5.0 runs/s (1 of 2 workers without a rate)` where a live worker
    gives none (the sum lacks it); `-` where none gives one."""
    if total is None:
        return "-"
    if not total.missing:
        return form.format(total.value)
    lacking = f"{total.missing} of {total.of} workers without a rate"
    return f"at least {form.format(total.value)} ({lacking})"
