"""What `tempered train` prints: the progress line and the closing summary say how many flat
groups the run redrew (dynamic sampling) and leave the solve rate out of a 1-turn evaluation;
the live table says the reward is the mean of the groups a step trained."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from contracts.learner import LearnerProgress
from contracts.run import EvalResult, RunProgress, TrainingRunInput, TrainingRunResult
from infra.settings import Settings
from workers.cli.progress import progress_line, summary, view

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
    assert "6 steps, 30/30 tasks (6 flat groups redrawn); held-out pass@1: v0 0.38, v6 0.50" in text
    assert "solved within" not in text


def test_the_table_says_whose_mean_the_reward_is(tmp_path: Path) -> None:
    # flat groups redrawn never reach the learner: the figure is not the mean of every rollout
    step = LearnerProgress(step=2, policy_version=2, trained_groups=4, reward_mean=0.15)
    table = view(RUN, RunProgress(learner=[step]), 30.0, Settings(home=tmp_path))
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(table)
    [row] = [line for line in console.export_text().splitlines() if "+0.150" in line]
    assert " ".join(row.split()) == "reward +0.150 (mean of the groups trained at step 2)"
