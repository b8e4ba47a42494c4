"""A run whose learner ended on a newer build: the learner continues as new onto the newest
build while its run stays on its own, so the learner's result may hold fields the run's build
does not know. The run decodes it as it decodes the `learner_done` signal (extra fields
ignored); before, the strict decode failed the run's workflow task for ever."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio import workflow

from contracts.learner import LearnerInput
from infra.storage import ObjectStore
from tests.fixtures.temporal import time_skipping_server
from tests.workflows.control_plane import (
    ScriptedSuite,
    ScriptedTrainer,
    control_plane,
    run_to_end,
)
from tests.workflows.test_training_run_order import RUN
from workflows.learner import LearnerWorkflow


@workflow.defn(name="LearnerWorkflow", sandboxed=False)
class NewerLearner(LearnerWorkflow):
    """The learner of a later build: its final state carries a field this build lacks."""

    @workflow.run
    async def run(self, learner_input: LearnerInput) -> dict[str, Any]:  # type: ignore[override]
        final = (await super().run(learner_input)).model_dump(mode="json")
        final["config"]["a_later_builds_knob"] = 1
        return final


@pytest.mark.asyncio
async def test_a_learner_that_ended_on_a_newer_build_ends_its_run(store: ObjectStore) -> None:
    run = RUN.model_copy(update={"run_id": "newer"})
    async with (
        time_skipping_server() as env,
        control_plane(
            env.client, store, ScriptedSuite(train=12), ScriptedTrainer(), learner=NewerLearner
        ),
    ):
        # before, its workflow task failed for ever: the run never ended
        result, _ = await asyncio.wait_for(run_to_end(env.client, run, "train-newer"), 60)
    assert result.steps == run.steps
