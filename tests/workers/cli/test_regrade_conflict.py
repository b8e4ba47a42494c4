"""`tempered regrade` rerun under a grader name whose stored verdicts differ from today's (the
suite changed since, or flaky tests): the stored records stay, and the command exits 1 saying a
new `--grader` name records the new verdicts (it exited 0: "kept it", nothing else). Real
SeaweedFS and the local sandbox backend."""

from __future__ import annotations

import pytest

from contracts.run import TrainingRunInput, drawn_task
from contracts.sandbox import ExecStatus
from contracts.trajectory import RewardRecord
from infra import keys
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import load_suite
from tests.workers.cli.regrade_setup import regrade_help, solved_trajectory
from tests.workers.cli.regrade_setup import settings as settings  # a fixture
from workers.cli import run

RUN = "conflicted"


def test_a_rerun_whose_verdict_differs_from_the_stored_one_exits_1_naming_the_way_out(
    store: ObjectStore, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    task = drawn_task(load_suite("starter", split="train")[:1], 0)
    solved = solved_trajectory(task, RUN)
    store.put_json(keys.run_record_key(RUN), TrainingRunInput(run_id=RUN, group_size=1))
    store.put_json(keys.trajectory_key(RUN, task.id, 0), solved)
    key = keys.reward_key(RUN, "v2", task.id, 0)
    earlier = RewardRecord(  # what grader v2 said under the suite as it was then
        trajectory_id=solved.id,
        grader="v2",
        suite="starter",
        status=ExecStatus.FAILED,
        tests_total=3,
        solved=False,
        reward=-0.1,
        previous_solved=True,
        previous_reward=1.0,
    )
    store.put_json(key, earlier)
    assert run(["regrade", RUN, "--grader", "v2"], settings) == 1
    captured = capsys.readouterr()
    told = " ".join((captured.out + captured.err).split())
    assert f"{key} holds a different verdict" in told, told
    assert "suite changed" in told and "flaky" in told and "new --grader" in told, told
    assert store.get_model(key, RewardRecord) == earlier  # kept, never overwritten

    assert run(["regrade", RUN, "--grader", "v3"], settings) == 0  # the way out it names
    assert store.get_model(keys.reward_key(RUN, "v3", task.id, 0), RewardRecord).solved


def test_regrade_help_says_a_new_grader_name_records_new_verdicts() -> None:
    text = regrade_help()
    assert "new --grader" in text and "exit" in text, text
