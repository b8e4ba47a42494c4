"""`tempered regrade` without `--suite` told to name a suite whenever anything was skipped,
also for skips a suite cannot help: a workspace episode (its verifier grades it), a
trajectory without a program, a task that "is another problem now". The hint is for the
"not in suite" kind only (`infra.regrade.NOT_IN_SUITE`). And its exit text said "2: bad input
… nothing regraded", but a run whose reading failed after some verdicts were written exited 2
with them stored: the help, docstring and error now say those are kept and a rerun with the
same `--grader` resumes. Real SeaweedFS and the local sandbox backend."""

from __future__ import annotations

import pytest

from contracts.run import TrainingRunInput, drawn_task
from contracts.task import EnvName
from contracts.trajectory import RewardRecord, Trajectory
from infra import keys
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import load_suite
from tests.trajectories import Step, trajectory
from tests.workers.cli.regrade_setup import regrade_help, solved_trajectory
from tests.workers.cli.regrade_setup import settings as settings  # a fixture
from workers.cli import regrade as regrade_module
from workers.cli import run

RUN = "skips"


def stored(store: ObjectStore, count: int) -> list[Trajectory]:
    """A run of `count` solved trajectories of `starter` train tasks, its run.json stored."""
    store.put_json(keys.run_record_key(RUN), TrainingRunInput(run_id=RUN, group_size=1))
    train = load_suite("starter", split="train")
    return [solved_trajectory(drawn_task(train[k : k + 1], 0), RUN) for k in range(count)]


def test_skips_a_suite_cannot_help_give_no_suite_hint(
    store: ObjectStore, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    other, workspace, empty = stored(store, 3)
    skipped = [
        other.model_copy(update={"prompt": "another problem"}),
        workspace.model_copy(update={"env": EnvName.WORKSPACE}),
        empty.model_copy(update={"steps": []}),
    ]
    for made in skipped:
        store.put_json(keys.trajectory_key(RUN, made.task_id, made.sample), made)

    assert run(["regrade", RUN], settings) == 1
    captured = capsys.readouterr()
    out, err = " ".join(captured.out.split()), " ".join(captured.err.split())
    assert "is another problem now" in out and "graded by its verifier" in out, out
    assert "has no program" in out, out
    assert "--suite" not in err, err

    gone = trajectory([Step([1], [2], code="x = 1")], run_id=RUN, task_id="gone-e0", group_size=1)
    store.put_json(keys.trajectory_key(RUN, gone.task_id, 0), gone)
    assert run(["regrade", RUN], settings) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "--suite FILE.jsonl" in err, err  # a task the suite does not have: the hint helps


def test_a_failure_after_some_verdicts_keeps_them_and_says_a_rerun_resumes(
    store: ObjectStore,
    settings: Settings,
    capsys: pytest.CaptureFixture[str],
) -> None:
    made = stored(store, 3)
    for one in made:
        store.put_json(keys.trajectory_key(RUN, one.task_id, 0), one)
    broken = keys.trajectory_key(RUN, "zzz-last-e0", 0)  # drawn last: after verdicts are written
    store.put_bytes(broken, b"{not a trajectory")

    assert run(["regrade", RUN, "--grader", "g"], settings) == 2
    err = " ".join(capsys.readouterr().err.split())
    written = list(store.list_keys(keys.rewards_prefix(RUN, "g")))
    assert written, "no verdict was written before the failure"
    assert "verdicts written before it are kept" in err, err
    assert "a rerun with the same --grader resumes" in err, err
    for text in (regrade_help(), " ".join((regrade_module.__doc__ or "").split())):
        assert "nothing regraded" not in text, text
        assert "verdicts written before it are kept" in text, text
        assert "a rerun with the same --grader resumes" in text, text

    store.delete(broken)
    assert run(["regrade", RUN, "--grader", "g"], settings) == 0  # resumes: the rest graded
    for one in made:
        assert store.get_model(keys.reward_key(RUN, "g", one.task_id, 0), RewardRecord).solved
