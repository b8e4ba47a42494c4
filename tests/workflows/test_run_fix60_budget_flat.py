"""Flat groups in flight at the time budget's deadline are sent to the learner, as after a
`stop` (`TrainingRunWorkflow`, `BUDGET_SENDS_FLAT_PATCH`), on the time-skipping test server with
scripted tasks, suite and train step (tests/workflows/control_plane.py).

No task starts at or after the deadline, so a flat group finishing then has no task to take its
slot. Before, it was redrawn all the same (dynamic sampling): counted in `redrawn`, never sent,
and the learner's last steps trained on fewer groups (here: on none). The first of them ends
before the run's loop has seen the deadline (`_budget_spent` is still False then): the deadline
itself decides."""

from __future__ import annotations

import asyncio
import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory

from contracts.learner import GRPOConfig
from contracts.names import Queue, task_workflow_id
from contracts.run import TrainingRunInput
from infra.storage import ObjectStore
from tests.fixtures.temporal import time_skipping_server
from tests.workflows.control_plane import (
    ScriptedSuite,
    ScriptedTrainer,
    StandInAgentTask,
    control_plane,
)
from tests.workflows.replaying import replay, replays_on_its_branch_only
from tests.workflows.test_training_run_children import started_children
from tests.workflows.test_training_run_fails_at_once import patched
from workflows.training_run import (
    BUDGET_SENDS_FLAT_PATCH,
    STOPPED_BY_SIGNAL,
    TIME_BUDGET_SPENT,
    TrainingRunWorkflow,
)

HISTORIES = Path(__file__).parent / "histories"
RECORDED = "training_run_budget_sends_flat.json"
"""The `budget` case's run (written by `test_flat_groups_in_flight_at_the_end_are_sent` with
TEMPERED_RECORD_HISTORIES=1)."""
RUN = TrainingRunInput(
    run_id="budget-flat",
    steps=3,  # 6 groups: the 4 in flight at the end are not all of them
    group_size=2,
    concurrency=4,
    grpo=GRPOConfig(groups_per_step=2, max_staleness=1, redraw_flat_groups=100),
)


@workflow.defn(name="AgentTaskWorkflow", sandboxed=False)
class SlowAgentTask(StandInAgentTask):
    """The stand-in at 10–300 (skipped) seconds a task: each ends after a 5 s budget."""

    UNIT = timedelta(seconds=10)

    @workflow.run
    async def run(self, raw: dict[str, Any]) -> dict[str, Any]:
        return await super().run(raw)


@pytest.mark.asyncio
@pytest.mark.parametrize("end", ["stop", "budget"])
async def test_flat_groups_in_flight_at_the_end_are_sent(store: ObjectStore, end: str) -> None:
    """Every task is flat; four are in flight when the run stops starting them (a `stop`, or
    its 5 s budget's deadline) and each ends after that: all four reach the learner, which
    takes two steps (before, on the budget: all four redrawn, no step)."""
    trainer, suite = ScriptedTrainer(), ScriptedSuite(train=10, flat_every=1)
    budget = 5 if end == "budget" else 0
    run = RUN.model_copy(update={"run_id": f"flat-{end}", "time_budget_s": budget})
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, suite, trainer, agent_task=SlowAgentTask),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, run, id=f"train-{run.run_id}", task_queue=Queue.AGENT_TASKS
        )
        started = await started_children(handle, 4)
        if end == "stop":
            await handle.signal(TrainingRunWorkflow.stop)
        result = await asyncio.wait_for(handle.result(), 60)
        history = await handle.fetch_history()

    assert result.stopped == (TIME_BUDGET_SPENT if budget else STOPPED_BY_SIGNAL), result
    assert (result.tasks_started, result.tasks_done, result.redrawn) == (4, 4, 0), result
    trained = sorted(task_workflow_id(run.run_id, task) for task in trainer.trained())
    assert trained == sorted(started), trainer.steps  # before, on the budget: none
    assert result.steps == 2, result
    await replay(history, TrainingRunWorkflow)
    if budget:
        assert patched(history, BUDGET_SENDS_FLAT_PATCH)
        if os.environ.get("TEMPERED_RECORD_HISTORIES"):
            (HISTORIES / RECORDED).write_text(history.to_json())


@pytest.mark.asyncio
async def test_the_recorded_run_replays_only_behind_its_patch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The recorded run replays; on its `branch_only` copy (tests/workflows/replaying.py) it
    replays with the patch answered True, and not on code that redraws them (False): sending
    them changed the run's commands."""
    text = (HISTORIES / RECORDED).read_text()
    history = WorkflowHistory.from_json("train-flat-budget", json.loads(text))
    assert patched(history, BUDGET_SENDS_FLAT_PATCH)
    await replay(history, TrainingRunWorkflow)
    await replays_on_its_branch_only(
        monkeypatch, history, BUDGET_SENDS_FLAT_PATCH, True, TrainingRunWorkflow
    )
