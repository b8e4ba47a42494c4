"""The run profile from span files: an exclusive split of the window by category priority
(training before evaluation), each category's own busy time, other runs' spans (their activities,
and the engine's requests and programs they waited on) and spans outside the window left out, and
a stretch no worker wrote anything in told apart from Temporal's share, and no profile where no
worker wrote anything here."""

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


def metrics(at: float) -> str:
    """A metric snapshot's record (what a live worker writes every 10 s), points left out."""
    return (
        json.dumps({"kind": "metrics", "ts": T0 + at, "points": []}, separators=(",", ":")) + "\n"
    )


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
        + metrics(85)  # the worker is up
    )
    (tmp_path / "learner-2.jsonl").write_text(
        span("learner.train_step", 45, 20, **{"tempered.run_id": "r1"})  # learner 45-65
    )
    (tmp_path / "sandbox-3.jsonl").write_text(  # 40-70, a rollout's program
        span("RunActivity:execute", 40, 30, ("x1", None), temporalWorkflowID="r1-task-a")
        + span("sandbox.run", 40, 30, ("s1", "x1"))
    )
    profile = run_profile(tmp_path, "r1", T0, T0 + 100)
    assert profile.wall_s == 100
    assert profile.segments == {
        "learner": 20.0,  # 45-65
        "inference": 45.0,  # 0-50, less the learner's
        "sandbox": 5.0,  # 40-70 (training's), less the above
        "activities": 0.0,  # 0-55: all taken already
        "evaluation": 0.0,  # 20-70: likewise, training's before the evaluation's
        "workers_down": 0.0,  # no stretch of 30 s without a record (a snapshot at 85)
        "temporal": 30.0,  # 70-100: nothing ran
    }
    assert profile.busy == {
        "learner": 20.0,
        "inference": 50.0,
        "sandbox": 30.0,
        "activities": 70.0,
        "evaluation": 50.0,
    }
    assert profile.inference_idle_s == 37  # the engine had a request 0-50 and 55-68
    assert profile.spans == 8


def test_no_worker_record_in_the_window_is_no_profile(tmp_path: Path) -> None:
    # workers on another machine, or exporting to an OTLP collector, write no file here: that
    # says nothing of where the time went (it read as 100% Temporal's)
    absent = run_profile(tmp_path / "none", "r1", T0, T0 + 10)
    (tmp_path / "inference-1.jsonl").write_text(metrics(-60) + span("RunActivity:a", -50, 5))
    before = run_profile(tmp_path, "r1", T0, T0 + 10)  # an earlier run's file, nothing since
    for profile in (absent, before):
        assert profile.segments is None and profile.busy is None, profile
        assert profile.inference_idle_s is None and profile.spans == 0 and profile.wall_s == 10
    (tmp_path / "inference-1.jsonl").write_text(metrics(5))  # a worker here, idle: Temporal's
    idle = run_profile(tmp_path, "r1", T0, T0 + 10)
    assert idle.segments is not None and idle.segments["temporal"] == 10


def test_a_workspace_tool_call_in_its_sandbox_is_sandbox_time(tmp_path: Path) -> None:
    # a workspace suite's env_step activity spends its time in `sandbox.env_step` (the tool
    # call in the episode's sandbox), which read as `activities`
    (tmp_path / "sandbox-1.jsonl").write_text(
        span("RunActivity:env_step", 0, 50, ("a1", None), temporalWorkflowID="r1-task-t1")
        + span("sandbox.env_step", 1, 48, ("e1", "a1"))
        + metrics(99)
    )
    profile = run_profile(tmp_path, "r1", T0, T0 + 100)
    assert profile.segments is not None and profile.busy is not None
    assert profile.segments["sandbox"] == 48 and profile.segments["activities"] == 2
    assert profile.busy["sandbox"] == 48 and profile.spans == 2


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
        "workers_down": 0.0,
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


def test_another_runs_requests_and_programs_are_not_this_runs(tmp_path: Path) -> None:
    # run r1 only waits (one 5 s activity) while run r2 rolls out beside it and a `tempered
    # eval` (no activity of r1's around its request) samples: none of that is r1's inference or
    # sandbox time (before: 60 s of inference, 60%, and 25 s of sandbox, 3 spans)
    (tmp_path / "inference-1.jsonl").write_text(
        span("RunActivity:generate", 0, 5, ("a1", None), temporalWorkflowID="r1-task-x")
        + span("RunActivity:generate", 10, 60, ("b1", None), temporalWorkflowID="r2-task-y")
        + span("model.generate", 10, 60, ("g1", "b1"))
        + span("model.generate", 80, 10, ("g2", "c1"))  # the eval's: its activity is c1
    )
    (tmp_path / "sandbox-1.jsonl").write_text(
        span("RunActivity:execute", 70, 25, ("b2", None), temporalWorkflowID="r2-task-y")
        + span("sandbox.run", 70, 25, ("s1", "b2"))
        + span("sandbox.run", 96, 2)  # no parent at all
    )
    (tmp_path / "learner-1.jsonl").write_text(
        span("learner.train_step", 20, 30, ("l1", "b3"))  # no run named, not under r1's activity
    )
    profile = run_profile(tmp_path, "r1", T0, T0 + 100)
    assert profile.segments["inference"] == profile.segments["sandbox"] == 0, profile.segments
    assert profile.segments["learner"] == 0
    assert profile.segments["activities"] == 5 and profile.spans == 1
    assert profile.inference_idle_s == 100  # the engine had none of r1's requests


def test_a_stretch_no_worker_wrote_anything_in_is_not_temporals(tmp_path: Path) -> None:
    # the machine went down 20 s into the run and came back at 200 (`--attach` after a
    # reboot measures from the first segment's start): the workers wrote neither spans nor
    # metric snapshots in between, so those 180 s are `workers_down`, not Temporal's cost; the
    # short gaps between records while they ran stay `temporal`
    (tmp_path / "inference-1.jsonl").write_text(
        span("RunActivity:generate", 0, 10, temporalWorkflowID="r1-task-x")
        + metrics(20)
        + span("RunActivity:generate", 200, 10, temporalWorkflowID="r1-task-x")
    )
    (tmp_path / "sandbox-1.jsonl").write_text(metrics(0))
    profile = run_profile(tmp_path, "r1", T0, T0 + 220)
    assert profile.segments["activities"] == 20
    assert profile.segments["workers_down"] == 180  # 20-200
    assert profile.segments["temporal"] == 20  # 10-20 and 210-220
    assert sum(profile.segments.values()) == profile.wall_s == 220
