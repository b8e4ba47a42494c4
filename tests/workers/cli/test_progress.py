"""What `tempered train` prints: the progress line and the closing summary say how many flat
groups the run redrew (dynamic sampling) and leave the solve rate out of a 1-turn evaluation;
an evaluation shows its tasks solved of how many, and the summary the gain in points, or that no
trained version was evaluated; the live table says the reward is the mean of the groups sent to a
step, and "-" for the workers' rates where no worker telemetry is here."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from contracts.evaluation import EvalResult
from contracts.learner import LearnerProgress
from contracts.run import RunProgress, TrainingRunInput, TrainingRunResult
from infra.settings import Settings
from workers.cli.progress import eval_text, progress_line, summary, view

RUN = TrainingRunInput(run_id="r", steps=6)


def test_the_progress_line_counts_flat_groups_only_when_there_are_some() -> None:
    busy = RunProgress(tasks_started=9, tasks_done=5, in_flight=4, redrawn=2)
    assert "tasks 5 done, 4 in flight, 2 flat | reward" in progress_line(RUN, busy)
    assert "flat" not in progress_line(RUN, busy.model_copy(update={"redrawn": 0}))


def test_the_summary_counts_redrawn_groups_and_shows_pass_at_1_alone_for_one_turn() -> None:
    evals = [
        EvalResult(policy_version=v, pass_at_1=p, tasks=80, solve_rate=p, turns=1)
        for v, p in ((0, 0.375), (6, 0.5))
    ]
    result = TrainingRunResult(
        run_id="r", steps=6, tasks_started=30, tasks_done=30, redrawn=6, history=[], evals=evals
    )
    text = summary(result, 400.0)
    assert "6 steps, 30/30 tasks (6 flat groups redrawn); held-out pass@1: " in text
    assert text.endswith("v0 30/80 (0.38), v6 40/80 (0.50), +12.5 points"), text
    assert "solved within" not in text


def test_the_summary_of_a_run_without_a_trained_evaluation_says_so() -> None:
    """A run whose time budget ran out before its first learner step: v0 is all it measured."""
    v0 = EvalResult(policy_version=0, pass_at_1=23 / 80, tasks=80, solve_rate=23 / 80)
    result = TrainingRunResult(
        run_id="r",
        steps=0,
        tasks_started=2,
        tasks_done=2,
        history=[],
        evals=[v0],
        stopped="time budget spent",
    )
    text = summary(result, 600.0)
    assert "(stopped: time budget spent): 0 steps" in text
    assert text.endswith("v0 23/80 (0.29); no trained version evaluated"), text


def test_a_two_turn_evaluation_shows_both_counts() -> None:
    two = EvalResult(policy_version=3, pass_at_1=16 / 80, tasks=80, solve_rate=28 / 80, turns=2)
    assert eval_text(two) == "v3 16/80 (0.20) / 28/80 (0.35)"


def test_the_table_says_whose_mean_the_reward_is(tmp_path: Path) -> None:
    # flat groups redrawn never reach the learner: the figure is not the mean of every rollout
    step = LearnerProgress(step=2, policy_version=2, trained_groups=4, reward_mean=0.15)
    table = view(RUN, RunProgress(learner=[step]), 30.0, Settings(home=tmp_path))
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(table)
    [row] = [line for line in console.export_text().splitlines() if "+0.150" in line]
    assert " ".join(row.split()) == "reward +0.150 (mean of the groups sent to step 2)"


def test_without_worker_telemetry_here_the_rates_are_unknown_not_zero(tmp_path: Path) -> None:
    # workers on another machine, or exporting to an OTLP collector, write no file here: the
    # table showed "0 tokens/s" and "0.0 runs/s" for a run going at full speed
    table = view(RUN, RunProgress(), 30.0, Settings(home=tmp_path))
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(table)
    rows = {" ".join(line.split()) for line in console.export_text().splitlines()}
    assert {"inference -", "sandbox -"} <= rows, rows
