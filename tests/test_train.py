"""`tempered train --preset tiny --steps 3` through the real stack: the learner publishes three
versions, inference picks each one up (the tiny preset is synchronous, max_staleness 0, so the
groups of step b are sampled from version b), and every trajectory is trained on exactly once."""

from __future__ import annotations

import json

from contracts.names import Queue
from infra import keys
from infra.policy import latest_policy
from tests.accounting import account, stored_trajectories
from tests.fixtures.stack import Stack


def test_tiny_preset_trains_three_steps_end_to_end(stack: Stack) -> None:
    for queue in Queue:
        stack.start_worker(queue)
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
