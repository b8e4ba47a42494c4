"""The run report's steps: numbered by policy version (the learner keeps only its last
`HISTORY_TAIL` results, so a list index is no step), with how many steps the run took and
whether the list holds them all; the reward curve is labelled for what it averages."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure

from contracts.common import ObjectRef
from contracts.learner import PolicyVersion, TrainStepResponse
from contracts.run import EvalResult, TrainingRunInput, TrainingRunResult
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
    assert labels[0] == "mean reward of the groups trained at each step"
    assert xs[0] == list(range(21, steps + 1))  # the curve lines up with the evaluations


def test_a_short_run_lists_every_step(tmp_path: Path) -> None:
    out = write_report(
        Settings(home=tmp_path), TrainingRunInput(run_id="r", steps=3), result_of(3), 1.0
    )
    report = json.loads((out / "report.json").read_text())
    assert [row["step"] for row in report["steps"]] == [1, 2, 3]
    assert (report["steps_taken"], report["steps_listed"]) == (3, "all")
