"""The run report's steps: numbered by policy version (the learner keeps only its last
`HISTORY_TAIL` results, so a list index is no step), with how many steps the run took and
whether the list holds them all; the reward curve is labelled for what it averages. A run that
ended before a trained version was evaluated has no "after" (not its baseline again), and the
config is the run's input as started, not a later segment's resume state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure

from contracts.common import ObjectRef
from contracts.learner import PolicyVersion, TrainStepResponse
from contracts.run import (
    EvalResult,
    LoadTasksResponse,
    RunResume,
    TrainingRunInput,
    TrainingRunResult,
)
from infra.settings import Settings
from workers.cli.report import write_report
from workflows.learner import HISTORY_TAIL

ACK = ObjectRef(key="k", size=1, sha256="0" * 64)


def result_of(steps: int) -> TrainingRunResult:
    """A run of `steps` steps, its history cut to the learner's tail as `LearnerWorkflow` does."""
    history = [
        TrainStepResponse(
            policy=PolicyVersion(run_id="r", version=s, prefix="p", step=s),
            loss=0.0,
            trained=1,
            reward_mean=s / 1000,
            ack=ACK,
        )
        for s in range(1, steps + 1)
    ][-HISTORY_TAIL:]
    evals = [EvalResult(policy_version=v, pass_at_1=0.3, tasks=80) for v in (0, steps)]
    return TrainingRunResult(
        run_id="r", steps=steps, tasks_started=0, tasks_done=0, history=history, evals=evals
    )


def test_a_long_runs_steps_are_numbered_by_version_and_the_tail_is_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    drawn: list[Any] = []  # (legend labels, x of each line) of every figure saved
    monkeypatch.setattr(
        Figure,
        "savefig",
        lambda fig, *_, **__: drawn.extend(
            (ax.get_legend_handles_labels()[1], [list(line.get_xdata()) for line in ax.lines])
            for ax in fig.axes
        ),
    )
    steps = HISTORY_TAIL + 20
    out = write_report(
        Settings(home=tmp_path), TrainingRunInput(run_id="r", steps=steps), result_of(steps), 1.0
    )
    report = json.loads((out / "report.json").read_text())
    rows = report["steps"]
    assert len(rows) == HISTORY_TAIL
    assert rows[0]["step"] == rows[0]["policy_version"] == 21, rows[0]
    assert [row["step"] for row in rows] == list(range(21, steps + 1))
    assert report["steps_taken"] == steps
    assert report["steps_listed"] == f"the last {HISTORY_TAIL} of {steps}"
    [(labels, xs)] = [d for d in drawn if "held-out pass@1 (turn 1)" in d[0]]
    assert labels[0] == "mean reward of the groups sent to each step"
    assert xs[0] == list(range(21, steps + 1))  # the curve lines up with the evaluations


def test_a_short_run_lists_every_step(tmp_path: Path) -> None:
    out = write_report(
        Settings(home=tmp_path), TrainingRunInput(run_id="r", steps=3), result_of(3), 1.0
    )
    report = json.loads((out / "report.json").read_text())
    assert [row["step"] for row in report["steps"]] == [1, 2, 3]
    assert (report["steps_taken"], report["steps_listed"]) == (3, "all")


def test_a_run_that_ended_before_its_first_step_reports_no_after(tmp_path: Path) -> None:
    """Its time budget ran out before the learner's first step: v0's evaluation is all there
    is, and it was reported as both before and after, with no reason (`stopped` None)."""
    result = result_of(0).model_copy(update={"stopped": "time budget spent"})
    result.evals = [EvalResult(policy_version=0, pass_at_1=23 / 80, solve_rate=23 / 80, tasks=80)]
    run = TrainingRunInput(run_id="r", steps=7, time_budget_s=600)
    out = write_report(Settings(home=tmp_path), run, result, 600.0)
    report = json.loads((out / "report.json").read_text())
    assert report["pass_at_1_before"] == report["solve_rate_before"] == 23 / 80
    assert report["pass_at_1_after"] is None and report["solve_rate_after"] is None, report
    assert report["stopped"] == "time budget spent"


def test_the_config_is_the_runs_input_without_a_segments_resume(tmp_path: Path) -> None:
    """`--attach` after a continue-as-new reads the current segment's input, whose `resume`
    holds every task of the suite and the run's counters: not the run's configuration."""
    resume = RunResume(
        tasks=LoadTasksResponse(train=[], heldout=[]),
        started=4,
        done=4,
        progress=[],
        evals=[],
        deadline=None,
        segment=2,
    )
    run = TrainingRunInput(run_id="r", steps=3, resume=resume)
    out = write_report(Settings(home=tmp_path), run, result_of(3), 1.0)
    config = json.loads((out / "report.json").read_text())["config"]
    assert "resume" not in config and config["steps"] == 3
