"""The run profile from span files: an exclusive split of the window by category priority
(training before evaluation), each category's own busy time, other runs' spans and spans outside
the window left out."""

from __future__ import annotations

import json
from pathlib import Path

from infra.telemetry_profile import run_profile

T0 = 1_700_000_000.0


def span(
    name: str, start: float, seconds: float, ids: tuple[str, str | None] = ("", None), **attrs: str
) -> str:
    """A span record; `ids` are its span id and its parent's."""
    record = {"kind": "span", "name": name, "start": T0 + start, "duration_ms": seconds * 1000}
    record |= {"span_id": ids[0], "parent_id": ids[1], "attrs": attrs}
    return json.dumps(record, separators=(",", ":")) + "\n"


def test_the_window_is_split_by_priority_and_other_runs_are_left_out(tmp_path: Path) -> None:
    (tmp_path / "inference-1.jsonl").write_text(
        span("model.generate", 0, 40, ("g1", "a1"))  # 0-40 busy
        + span("model.generate", 30, 20, ("g2", "a1"))  # overlaps: busy 0-50
        + span("RunActivity:generate", 0, 55, ("a1", None), temporalWorkflowID="r1-task-a")
        # an evaluation beside the rollouts (20-50: theirs), then on its own (50-70); its
        # request counts as the engine's busy time, not as training inference
        + span("RunActivity:generate", 20, 50, ("e1", None), temporalWorkflowID="r1-eval-v0-a")
        + span("model.generate", 55, 13, ("g3", "e1"))
        + span("RunActivity:generate", 0, 90, temporalWorkflowID="other-task-a")  # not ours
        + span("model.generate", 200, 5)  # outside the window
        + '{"kind":"metrics","ts":1,"points":[]}\n'
    )
    (tmp_path / "learner-2.jsonl").write_text(
        span("learner.train_step", 45, 20, **{"tempered.run_id": "r1"})  # learner 45-65
    )
    (tmp_path / "sandbox-3.jsonl").write_text(span("sandbox.run", 40, 30))  # 40-70
    profile = run_profile(tmp_path, "r1", T0, T0 + 100)
    assert profile.wall_s == 100
    assert profile.segments == {
        "learner": 20.0,  # 45-65
        "inference": 45.0,  # 0-50, less the learner's
        "sandbox": 5.0,  # 40-70 (training's), less the above
        "activities": 0.0,  # 0-55: all taken already
        "evaluation": 0.0,  # 20-70: likewise, training's before the evaluation's
        "temporal": 30.0,  # 70-100: nothing ran
    }
    assert profile.busy == {
        "learner": 20.0,
        "inference": 50.0,
        "sandbox": 30.0,
        "activities": 55.0,
        "evaluation": 50.0,
    }
    assert profile.inference_idle_s == 37  # the engine had a request 0-50 and 55-68
    assert profile.spans == 7


def test_no_span_files_is_an_all_temporal_profile(tmp_path: Path) -> None:
    profile = run_profile(tmp_path / "none", "r1", T0, T0 + 10)
    assert profile.segments["temporal"] == 10 and profile.spans == 0


def test_spans_of_a_rotated_file_still_count(tmp_path: Path) -> None:
    # a busy worker's file rotates (`infra.telemetry_files.ROTATE_BYTES`): its older spans are in
    # `<file>.1` and belong to the run as much as those of the current file
    (tmp_path / "learner-2.jsonl.1").write_text(
        span("learner.train_step", 0, 10, **{"tempered.run_id": "r1"})
    )
    (tmp_path / "learner-2.jsonl").write_text(
        span("learner.train_step", 20, 10, **{"tempered.run_id": "r1"})
    )
    profile = run_profile(tmp_path, "r1", T0, T0 + 40)
    assert profile.segments["learner"] == 20 and profile.spans == 2


def test_trainings_sandbox_and_activities_come_before_an_evaluations(tmp_path: Path) -> None:
    # training's program runs 0-10 while an evaluation task's store write is open (2-8): the
    # time is training's, as the caption says; the evaluation's own program is evaluation
    (tmp_path / "w.jsonl").write_text(
        span("RunActivity:execute", 0, 10, ("t1", None), temporalWorkflowID="r-task-x")
        + span("sandbox.run", 0, 10, ("t2", "t1"))
        + span(
            "RunActivity:write_trajectories", 2, 6, ("e1", None), temporalWorkflowID="r-eval-v0-y"
        )
        + span("RunActivity:execute", 20, 10, ("e2", None), temporalWorkflowID="r-eval-v0-y")
        + span("sandbox.run", 21, 8, ("e3", "e2"))
    )
    profile = run_profile(tmp_path, "r", T0, T0 + 30)
    assert profile.segments == {
        "learner": 0.0,
        "inference": 0.0,
        "sandbox": 10.0,  # 0-10: training's program
        "activities": 0.0,  # 0-10: under it
        "evaluation": 10.0,  # 20-30: the evaluation's activity and its program
        "temporal": 10.0,
    }
    assert profile.busy["sandbox"] == 10 and profile.busy["evaluation"] == 16


def test_a_run_whose_id_starts_with_anothers_is_not_it(tmp_path: Path) -> None:
    # "r2"'s spans are not "r"'s, though "r" is in its workflow ids; each of "r"'s own
    # workflows counts: the run's, its learner's, its tasks' and its evaluations'
    ours = {"train-r": 1, "train-r-learner": 11, "r-task-a": 21, "r-eval-v3-a": 31}
    theirs = ("train-r2", "train-r2-learner", "r2-task-a", "r2-eval-v3-a", "xr-task-a", "r-tasks")
    (tmp_path / "w.jsonl").write_text(
        "".join(
            span("RunActivity:a", start, 5, temporalWorkflowID=workflow)
            for workflow, start in ours.items()
        )
        + "".join(span("RunActivity:a", 40, 50, temporalWorkflowID=w) for w in theirs)
    )
    profile = run_profile(tmp_path, "r", T0, T0 + 100)
    assert profile.segments["activities"] == 15 and profile.segments["evaluation"] == 5
    assert profile.spans == 4
