"""The gain a run's closing line and report.json give: where no held-out task can be solved at
its first turn (every one a `workspace` task, graded only once the agent has acted and called
`submit`), the solve rate within the evaluation's turns, not pass@1 at turn 1, which is 0 by
construction: an `agent` run that went 0.50 → 0.75 closed with ", +0 points at turn 1" and a
report whose only before/after was pass@1 0 → 0. Where pass@1 means something (code tasks) it
stays the headline. The held-out tasks are the real suites' (`basics`, `starter`)."""

from __future__ import annotations

import json
from pathlib import Path

from temporalio.contrib.pydantic import pydantic_data_converter

from contracts.evaluation import EvalResult
from contracts.rollout import AgentTaskResult
from contracts.run import RunProgress, TrainingRunInput, TrainingRunResult
from contracts.task import TaskSpec
from infra.settings import Settings
from infra.tasks import load_suite
from workers.cli.progress import gain_text, pass_at_1_text, progress_line, summary
from workers.cli.report import write_report


def result(solved: bool, turns: int, at: int = 0) -> AgentTaskResult:
    return AgentTaskResult(
        run_id="r", task_id=f"t{at}", state="done", turns=turns,
        rewards=[1.0 if solved else 0.0], solved=[solved], best_reward=0.0,
        policy_versions=[0], trajectories=[],
    )  # fmt: skip


def evals(tasks: list[TaskSpec] | None, turns: int = 4) -> list[EvalResult]:
    """v0 solves half the 20 tasks within `turns` turns (at turn 2), v8 three quarters."""
    return [
        EvalResult.of(
            version,
            [result(True, 2, i) for i in range(solved)]
            + [result(False, turns, i) for i in range(solved, 20)],
            turns,
            *([tasks] if tasks is not None else []),
        )
        for version, solved in ((0, 10), (8, 15))
    ]


def run_result(measured: list[EvalResult]) -> TrainingRunResult:
    return TrainingRunResult(
        run_id="r", steps=8, tasks_started=32, tasks_done=32, history=[], evals=measured
    )


def basics() -> list[TaskSpec]:
    tasks = load_suite("basics", split="heldout")
    assert len(tasks) == 20 and {t.env for t in tasks} == {"workspace"}
    return tasks


def test_a_workspace_runs_closing_line_gives_the_solve_rate_gain() -> None:
    measured = evals(basics())
    assert all(e.graded_at_submit for e in measured)
    text = summary(run_result(measured), 820.0)
    assert text.endswith(
        "held-out solved within 4 turns: v0 10/20 (0.50), v8 15/20 (0.75), +25 points"
    ), text
    assert "pass@1" not in text and "turn 1" not in text, text


def test_a_workspace_runs_progress_and_status_give_the_solve_rate() -> None:
    measured = evals(basics())
    line = progress_line(TrainingRunInput(run_id="r", steps=8), RunProgress(evals=measured))
    assert line.endswith("| solved within 4 turns v0 10/20 (0.50)  v8 15/20 (0.75)"), line
    assert pass_at_1_text(measured) == "0.75 (v8, solved within 4 turns)"


def test_without_the_tasks_a_multi_turn_line_gives_both_gains() -> None:
    """Evaluations that do not say what their tasks are (an earlier build's, or a caller that
    gave no tasks): pass@1 stays the headline, and the solve rate's gain is said beside it."""
    measured = evals(None)
    assert gain_text(measured) == ", +0 points at turn 1, +25 points solved within 4 turns"
    assert not any(e.graded_at_submit for e in measured)


def test_a_code_runs_two_turn_line_keeps_pass_at_1_first() -> None:
    starter = load_suite("starter", split="heldout")[:20]
    measured = [
        EvalResult.of(
            version,
            [result(True, 1, i) for i in range(first)]
            + [result(True, 2, i) for i in range(first, within)]
            + [result(False, 2, i) for i in range(within, 20)],
            2,
            starter,
        )
        for version, first, within in ((0, 4, 6), (6, 8, 9))
    ]
    assert not any(e.graded_at_submit for e in measured)
    text = summary(run_result(measured), 400.0)
    assert "held-out pass@1 / solved within 2 turns: v0 4/20 (0.20) / 6/20 (0.30)" in text, text
    assert text.endswith(", +20 points at turn 1, +15 points solved within 2 turns"), text


def test_a_workspace_runs_report_headline_is_the_solve_rate(tmp_path: Path) -> None:
    run = TrainingRunInput(run_id="r", steps=8, suite="basics", max_turns=4)
    out = write_report(Settings(home=tmp_path / "home"), run, run_result(evals(basics())), 820.0)
    report = json.loads((out / "report.json").read_text())
    assert report["headline"] == {
        "figure": "solve_rate",
        "label": "held-out solved within 4 turns",
        "before": 0.5,
        "after": 0.75,
        "gain_points": 25.0,
    }, report["headline"]
    # the fields other readers take are still there
    assert (report["pass_at_1_before"], report["pass_at_1_after"]) == (0.0, 0.0)
    assert (report["solve_rate_before"], report["solve_rate_after"]) == (0.5, 0.75)
    assert [e["graded_at_submit"] for e in report["evals"]] == [True, True]


def test_a_code_runs_report_headline_is_pass_at_1(tmp_path: Path) -> None:
    measured = [
        EvalResult(policy_version=v, pass_at_1=p, tasks=80, solve_rate=p) for v, p in ((0, 0.3),)
    ]
    out = write_report(
        Settings(home=tmp_path / "home"), TrainingRunInput(run_id="r"), run_result(measured), 1.0
    )
    report = json.loads((out / "report.json").read_text())
    assert report["headline"] == {
        "figure": "pass_at_1",
        "label": "held-out pass@1",
        "before": 0.3,
        "after": None,
        "gain_points": None,
    }, report["headline"]


def test_an_evaluation_of_code_tasks_is_on_the_wire_as_before() -> None:
    """`graded_at_submit` stays off the wire while False (`empty_left_out`): a run's progress
    and result read by a reader of the release before (which refuses unknown fields) decode."""
    converter = pydantic_data_converter.payload_converter
    code = EvalResult.of(0, [result(True, 1)], 2, load_suite("starter", split="heldout")[:1])
    [payload] = converter.to_payloads([code])
    assert b"graded_at_submit" not in payload.data
    workspace = EvalResult.of(0, [result(True, 2)], 4, basics()[:1])
    [payload] = converter.to_payloads([workspace])
    assert converter.from_payloads([payload], [EvalResult]) == [workspace]
    assert workspace.graded_at_submit
