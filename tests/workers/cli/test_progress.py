"""What `tempered train` prints: the progress line and the closing summary say how many flat
groups the run redrew (dynamic sampling) and leave the solve rate out of a 1-turn evaluation."""

from __future__ import annotations

from contracts.run import EvalResult, RunProgress, TrainingRunInput, TrainingRunResult
from workers.cli.progress import progress_line, summary

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
