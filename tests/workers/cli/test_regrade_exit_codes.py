"""`tempered regrade`'s exit codes are the ones its help and docstring state: 0 every
trajectory regraded, 1 some were not (skipped, the sandbox kept failing, or a stored verdict
kept that differs from today's: `test_regrade_conflict.py`), 2 bad input. Its help said only
"Exit 1 where a stored verdict differs", and a run whose tasks were skipped exited 1 too. A
hand-started run (README "Start a task without Python": no run.json, its task in no built-in
suite) was looked up in `starter`, skipped, and nothing said to name its suite. Real SeaweedFS
and the local sandbox backend."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts.sandbox import ExecStatus
from contracts.trajectory import RewardRecord
from infra import keys
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.trajectories import Step, trajectory
from tests.workers.cli.regrade_setup import regrade_help
from tests.workers.cli.regrade_setup import settings as settings  # a fixture
from workers.cli import run

RUN = "demo"
TASK = {
    "id": "demo-add",
    "prompt": "Write add(a, b) returning a + b.",
    "entry_point": "add",
    "tests": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
}


def test_a_hand_started_run_exits_1_naming_the_suite_flag_then_0_with_it(
    store: ObjectStore, settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    solved = trajectory(  # what the README's `temporal workflow start` stores: no run.json
        [Step([1], [2], code="def add(a, b):\n    return a + b\n", status=ExecStatus.PASSED)],
        reward=1.0,
        run_id=RUN,
        task_id=TASK["id"],
        sample=0,
        group_size=1,
        solved=True,
        prompt=TASK["prompt"],
    )
    store.put_json(keys.trajectory_key(RUN, TASK["id"], 0), solved)

    assert run(["regrade", RUN], settings) == 1  # not regraded: skipped
    captured = capsys.readouterr()
    out, err = " ".join(captured.out.split()), " ".join(captured.err.split())
    assert "'demo-add' is not in suite 'starter'" in out, out
    assert "run 'demo' has no run.json" in err and "--suite FILE.jsonl" in err, err

    suite = tmp_path / "mine.jsonl"
    suite.write_text(json.dumps(TASK) + "\n", encoding="utf-8")
    assert run(["regrade", RUN, "--suite", str(suite)], settings) == 0  # the way out it names
    assert "--suite" not in capsys.readouterr().err
    record = store.get_model(keys.reward_key(RUN, "current", TASK["id"], 0), RewardRecord)
    assert record.solved

    assert run(["regrade", "nosuch"], settings) == 2  # bad input
    assert "unknown run 'nosuch'" in capsys.readouterr().err


def test_regrade_help_states_each_exit_code() -> None:
    text = regrade_help()
    for said in (
        "Exit 0: every trajectory regraded",
        "1: some were not: skipped",
        "sandbox kept failing",
        "a stored verdict differs from today's and is kept",
        "2: bad input",
    ):
        assert said in text, text
