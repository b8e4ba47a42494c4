"""A train_step that loses the publish of its version to an attempt for other groups refuses to
answer with it (activities/learner.py, real SeaweedFS, two learner workers in one process).

After a Temporal reset of the learner, the old branch's attempt at step n may still publish
while the new branch's attempt, asked for other groups, trains: the new one found nothing
recorded when it began, trained its batch, lost the publish and answered with the winner's ack,
so its groups were marked consumed but never trained. Every other answer of a recorded step
checks the groups (`same_groups`): this one must too (STORED_CONFLICT, never a silent done)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.learner import LearnerActivities
from contracts.errors import ErrorType
from contracts.learner import StepRecord, TrainStepRequest
from contracts.run import PrepareRunRequest
from infra import keys
from infra.learner_base import Learner
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.activities.test_learner import CONFIG, RUN, write_group


class OvertakenActivities(LearnerActivities):
    """The real activities, whose step `overtaker` trains and publishes first once this one
    has loaded its version (past its check of what is recorded)."""

    def __init__(self, settings: Settings, store: ObjectStore) -> None:
        super().__init__(settings, store)
        self.overtaker: tuple[LearnerActivities, TrainStepRequest] | None = None

    def _engine_at(self, *args: Any, **kwargs: Any) -> Learner:
        engine = super()._engine_at(*args, **kwargs)
        if self.overtaker is not None:
            other, request = self.overtaker
            self.overtaker = None
            other._step(request, {}, threading.Event(), time.perf_counter())
        return engine


@pytest.mark.asyncio
async def test_a_step_that_loses_its_publish_to_other_groups_is_refused(
    store: ObjectStore, tmp_path: Path
) -> None:
    settings = Settings(home=tmp_path / "home")
    env = ActivityEnvironment()
    old_branch = LearnerActivities(settings, store)
    await env.run(old_branch.prepare_run, PrepareRunRequest(run_id=RUN, base_model="tiny"))
    old = TrainStepRequest(
        run_id=RUN, step=0, groups=[write_group(store, "old", 0, 1)], config=CONFIG
    )
    new = TrainStepRequest(
        run_id=RUN, step=0, groups=[write_group(store, "new", 0, 2)], config=CONFIG
    )
    new_branch = OvertakenActivities(Settings(home=tmp_path / "other"), store)
    new_branch.overtaker = (old_branch, old)
    with pytest.raises(ApplicationError, match="recorded for groups") as refused:
        await env.run(new_branch.train_step, new)
    assert refused.value.type == ErrorType.STORED_CONFLICT and refused.value.non_retryable
    assert new_branch.overtaker is None  # the old branch did publish first
    ack = store.get_model(keys.learner_ack_key(RUN, 0), StepRecord)
    assert ack.groups == ["old"]  # the winner's
    assert new_branch.engine is not None and new_branch.engine.version is None  # reloads next
