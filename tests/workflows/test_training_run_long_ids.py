"""A training run whose suite holds a task id too long to draw (`<id>-e<epoch>` over 128
characters) fails at the first such draw, naming the task (`contracts.run.drawn_task`), on the
time-skipping test server with the scripted control plane (tests/workflows/control_plane.py).
Before, it started the task with an input the task workflow could not decode: the task's
workflow task failed and was retried for ever, and the run waited on it for good."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio import workflow
from temporalio.exceptions import ApplicationError

from contracts.errors import ErrorType
from contracts.names import Queue
from contracts.task import AgentTaskInput
from infra.storage import ObjectStore
from tests.fixtures.temporal import time_skipping_server
from tests.workflows.control_plane import (
    ScriptedSuite,
    ScriptedTrainer,
    StandInAgentTask,
    control_plane,
)
from tests.workflows.test_training_run import RUN
from tests.workflows.test_training_run_children import failure
from workflows.training_run import TrainingRunWorkflow


@workflow.defn(name="AgentTaskWorkflow", sandboxed=False)
class DecodingAgentTask(StandInAgentTask):
    """The stand-in task, decoding its input as the real one's worker does."""

    @workflow.run
    async def run(self, raw: dict[str, Any]) -> dict[str, Any]:
        AgentTaskInput.model_validate(raw)
        return await super().run(raw)


@pytest.mark.asyncio
async def test_a_task_id_too_long_to_draw_fails_the_run_at_once(store: ObjectStore) -> None:
    suite = ScriptedSuite(train=2)
    long = "t" * 126
    suite.train[1] = suite.train[1].model_copy(update={"id": long})
    run = RUN.model_copy(update={"run_id": "long-ids", "steps": 2})
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, suite, ScriptedTrainer(), agent_task=DecodingAgentTask),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, run, id="train-long-ids", task_queue=Queue.AGENT_TASKS
        )
        cause = await failure(handle, 30)  # before: waited for good
    assert isinstance(cause, ApplicationError) and cause.type == ErrorType.INVALID_TASK, cause
    assert f"task {long!r}" in cause.message, cause.message
