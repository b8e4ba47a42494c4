"""`tempered train --preset tiny --steps 3` through the real stack: the learner publishes three
versions, inference picks each one up (the tiny preset is synchronous, max_staleness 0, so the
groups of step b are sampled from version b), and every trajectory is trained on exactly once.
A run also outlives its command: Ctrl-C detaches, `tempered train --attach` follows it again
and `tempered stop` ends it early, as a finished run ends; attached to once it has ended, it
writes the run's report again, from the workflow's result.

Both tests share one stack and one worker per queue with tests/test_staleness.py
(`trained_stack`, tests/fixtures/trained_stack.py): starting them was a third of each test. Each trains its own run id, one run at a time (`tempered train`
refuses to start beside a running one), so neither sees the other's run."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.run import RunRecord
from infra import keys
from infra.policy import latest_policy
from tests.accounting import account, stored_trajectories
from tests.fixtures.signals import DEFAULT_SIGINT
from tests.fixtures.stack import BIN, RUNNING, Stack

pytestmark = pytest.mark.xdist_group("trained_stack")  # one worker sets the stack up


def test_tiny_preset_trains_three_steps_end_to_end(trained_stack: Stack) -> None:
    stack = trained_stack
    trained = stack.tempered(
        "train",
        "--preset",
        "tiny",
        "--steps",
        "3",
        "--run-id",
        "tiny3",
        "--no-workers",
        timeout=600,
    )
    assert trained.returncode == 0, trained.stderr[-3000:] + stack.worker_logs()
    lines = re.findall(r"\] step (\d)/3 v\d \| tasks \d+ done", trained.stdout)  # not a terminal
    assert lines and lines == sorted(lines), trained.stdout
    report = json.loads((stack.home / "reports" / "tiny3" / "report.json").read_text())
    assert [s["policy_version"] for s in report["steps"]] == [1, 2, 3]
    assert [e["policy_version"] for e in report["evals"]] == [0, 3]
    assert report["tasks_started"] == report["tasks_done"] == 6
    assert (stack.home / "reports" / "tiny3" / "reward_curve.png").stat().st_size > 1000

    store = stack.store()
    assert latest_policy(store, "tiny3").version == 3  # type: ignore[union-attr]
    versions_by_step = sorted(t.policy_version for _, t in stored_trajectories(store, "tiny3"))
    assert versions_by_step == [0] * 8 + [1] * 8 + [2] * 8  # 2 groups of 4 per step
    ledger = account(store, "tiny3", tasks=6, group_size=4)
    ledger.assert_exactly_once()
    assert store.exists(keys.learner_ack_key("tiny3", 2))
    record = store.get_model(keys.run_record_key("tiny3"), RunRecord)  # what `eval --run` reads
    assert record.heldout is not None
    assert len(record.heldout.tasks) == record.heldout_limit, record.heldout


def test_a_run_outlives_its_command_and_stops_when_told(
    trained_stack: Stack, tmp_path: Path
) -> None:
    stack = trained_stack
    preset = tmp_path / "tiny-short-evals.toml"  # its evaluations, at v0 and after `stop`: 2 tasks
    preset.write_text('extends = "tiny"\nheldout_limit = 2\n')

    def tempered(*args: str) -> subprocess.Popen[str]:
        """`tempered ARGS`, with Ctrl-C's default action even where this test runs with SIGINT
        ignored (a background job of a non-interactive shell: its children inherit that)."""
        return subprocess.Popen(
            [sys.executable, "-c", DEFAULT_SIGINT, str(BIN / "tempered"), *args],
            env={**stack.env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    train = tempered("train", "--preset", str(preset), "--steps", "50", "--run-id", "long", "--no-workers")  # fmt: skip
    stack.wait_for("a finished task", stack.progress_reached("train-long", tasks_done=1), 300)
    train.send_signal(signal.SIGINT)  # Ctrl-C
    _, err = train.communicate(timeout=60)
    assert train.returncode == 130, err[-3000:]
    assert "tempered train --attach long" in err and "tempered stop long" in err
    assert stack.status("train-long") == RUNNING, "Ctrl-C ended the run, not only the command"

    attached = tempered("train", "--attach", "long", "--no-workers")
    assert attached.stdout is not None
    lines = [attached.stdout.readline() for _ in range(4)]  # the stack's lines, then ours
    assert any("attached to TrainingRunWorkflow train-long" in line for line in lines), lines
    missing = stack.tempered("stop", "no-such-run")
    assert missing.returncode == 2 and "no training run 'no-such-run'" in missing.stderr
    stopped = stack.tempered("stop", "long", "--reason", "enough for a test")
    assert stopped.returncode == 0, stopped.stderr
    out, err = attached.communicate(timeout=600)
    assert attached.returncode == 0, err[-3000:] + stack.worker_logs()
    assert "stopped: enough for a test" in out

    report = json.loads((stack.home / "reports" / "long" / "report.json").read_text())
    steps = len(report["steps"])
    assert report["stopped"] == "enough for a test" and 0 < steps < 50
    assert report["tasks_started"] == report["tasks_done"] < 50 * 2
    assert report["evals"][-1]["policy_version"] == steps, "no final evaluation"
    (stack.home / "reports" / "long" / "report.json").unlink()  # as if no one had followed it
    again = stack.tempered("train", "--attach", "long", "--no-workers")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "run long ended (completed) at " in again.stdout, again.stdout
    rewritten = json.loads((stack.home / "reports" / "long" / "report.json").read_text())
    assert (rewritten["steps"], rewritten["stopped"]) == (report["steps"], report["stopped"])
    # close minus start; the follower's own clock read the end up to a poll (2 s) later
    assert -1 < report["wall_time_s"] - rewritten["wall_time_s"] < 10
