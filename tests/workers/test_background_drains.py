"""A worker's drain has one home (`workers.background.drain_s`): its plan lets activities in
flight finish for as long as a stop (`tempered down`, a restart) waits for them."""

from __future__ import annotations

from pathlib import Path

from contracts.names import Queue
from infra.settings import Settings
from workers import learner
from workers.background import drain_s, stop_timeout_s
from workers.plan import WorkerPlan


def test_the_learners_plan_drains_as_long_as_a_stop_waits_for(tmp_path: Path) -> None:
    plan = learner.build(Settings(home=tmp_path))
    assert plan.drain_s == drain_s(Queue.LEARNER) > WorkerPlan.drain_s
    assert stop_timeout_s(Queue.LEARNER) > plan.drain_s
