"""Each activity's worker registers it: the learner's and the rewards' worker plans hold exactly
the activities `contracts.names.ACTIVITY_QUEUE` puts on their queue (an activity named there but
left out of its worker's plan is scheduled and never picked up: its workflow waits for ever).
The other queues' plans start a model, a sandbox or a workflow worker; their activities are
driven end to end elsewhere (tests/test_train.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.activity import _Definition

from contracts.names import ACTIVITY_QUEUE, Queue
from infra.settings import S3Settings, Settings
from tests.fixtures.cli_settings import nowhere_endpoint
from workers import learner, rewards


@pytest.mark.parametrize(
    ("queue", "build"), [(Queue.LEARNER, learner.build), (Queue.REWARDS, rewards.build)]
)
def test_a_plan_registers_every_activity_of_its_queue(queue: Queue, build, tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, s3=S3Settings(endpoint=nowhere_endpoint()))
    plan = build(settings)
    names = {_Definition.must_from_callable(fn).name for fn in plan.activities}
    assert names == {activity.value for activity, on in ACTIVITY_QUEUE.items() if on is queue}
