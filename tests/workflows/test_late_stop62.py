"""A `stop` that comes after a run has started every task it needs (`TrainingRunWorkflow`), on the
time-skipping test server with scripted tasks, suite and train step
(tests/workflows/control_plane.py): the run takes all its steps, so its result's `stopped` ("why
the run ended before its steps") is None, in the segment that got the signal and in one that
continues it as new. Before, every `stop` was reported, however late it came; the CLI printed
"(stopped: ...)" and report.json said so for a run that had trained every step."""

from __future__ import annotations

import asyncio

import pytest

from contracts.learner import GRPOConfig
from contracts.names import Queue
from contracts.run import TrainingRunInput
from infra.storage import ObjectStore
from tests.fixtures.temporal import time_skipping_server
from tests.workflows.control_plane import ScriptedSuite, ScriptedTrainer, control_plane
from tests.workflows.replaying import replay
from tests.workflows.test_run_fix60_budget_flat import SlowAgentTask
from tests.workflows.test_training_run import last_segment
from tests.workflows.test_training_run_children import started_children
from workflows.training_run import TrainingRunWorkflow

RUN = TrainingRunInput(
    run_id="stop-late",
    steps=2,
    group_size=2,
    concurrency=4,  # all 2 x 2 groups start at once
    grpo=GRPOConfig(groups_per_step=2, max_staleness=1),
)


@pytest.mark.asyncio
async def test_a_stop_after_every_task_started_is_not_reported(store: ObjectStore) -> None:
    """The signal lands while the four tasks (10 s each) are in flight: they finish, the learner
    takes both steps, and the run says it did not stop early (its `progress` still shows it
    was told to)."""
    trainer, suite = ScriptedTrainer(), ScriptedSuite(train=10)
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, suite, trainer, agent_task=SlowAgentTask),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, RUN, id=f"train-{RUN.run_id}", task_queue=Queue.AGENT_TASKS
        )
        await started_children(handle, 4)
        await handle.signal(TrainingRunWorkflow.stop, "late stop")
        result = await asyncio.wait_for(handle.result(), 60)
        progress = await handle.query(TrainingRunWorkflow.progress)
        history = await handle.fetch_history()
    assert (result.steps, result.tasks_started, result.tasks_done) == (2, 4, 4), result
    assert result.stopped is None, f"all {result.steps} steps taken, yet {result.stopped!r}"
    assert progress.stopping == "late stop"
    await replay(history, TrainingRunWorkflow)


@pytest.mark.asyncio
async def test_a_late_stop_carried_through_continue_as_new_is_not_reported(
    store: ObjectStore,
) -> None:
    """A segment that continues a run told to stop once every task had started (the stop landed
    while it drained before its ending): it starts nothing, and none was left to start."""
    result, _ = await last_segment(store, "late", started=4, learner_step=2, stopped="late")
    assert (result.tasks_started, result.steps, result.stopped) == (4, 2, None), result
