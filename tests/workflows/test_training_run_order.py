"""Which step trains a TrainingRunWorkflow's groups, on the time-skipping test server with
scripted tasks, suite and train step (tests/workflows/control_plane.py): a group started for
learner step b is trained at step b at the latest, however late it finishes, so none is dropped
as stale (`infra.grpo.staleness_weight`, the learner's rule) for finishing after a group of a
later step, also where flat groups are redrawn and the run continues as new."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow

from contracts.learner import GRPOConfig, HistoryBudget
from contracts.run import TrainingRunInput, draw_order, drawn_task
from infra.grpo import staleness_weight
from infra.storage import ObjectStore
from tests.fixtures.temporal import time_skipping_server
from tests.workflows.control_plane import (
    ScriptedSuite,
    ScriptedTrainer,
    StandInAgentTask,
    control_plane,
    run_histories,
    run_to_end,
)
from tests.workflows.replaying import replay
from workflows.training_run import ORDERED_GROUPS_PATCH, TrainingRunWorkflow

HISTORIES = Path(__file__).parent / "histories"
ORDERED_SEGMENTS = ("training_run_ordered_redraws.json", "training_run_ordered_redraws_1.json")
"""The two segments of the run with 5 redraws, replayed by test_replay_ordered.py."""
RUN = TrainingRunInput(  # the default preset's shape
    run_id="order",
    steps=3,
    group_size=2,
    concurrency=8,
    grpo=GRPOConfig(groups_per_step=4, max_staleness=1),
    budget=HistoryBudget(),
)


def dropped(trainer: ScriptedTrainer, run: TrainingRunInput) -> dict[str, str]:
    """Task id → how its group was trained, for each group the learner drops as stale."""
    grpo = run.grpo
    return {
        task: f"sampled from v{version}, trained at step {step}"
        for task, (step, version) in trainer.versions.items()
        if staleness_weight(version, step, grpo.max_staleness, grpo.stale_policy) == 0.0
    }


@workflow.defn(name="AgentTaskWorkflow", sandboxed=False)
class OneSlowTask(StandInAgentTask):
    """The stand-in, each task 1 `UNIT` but `SLOW`, 40."""

    SLOW = ""

    @workflow.run
    async def run(self, raw: dict[str, Any]) -> dict[str, Any]:
        return await super().run(raw)

    def units(self, task_id: str) -> int:
        return 40 if task_id == self.SLOW else 1


@pytest.mark.asyncio
async def test_a_group_that_finishes_after_a_later_steps_group_is_trained_at_its_step(
    store: ObjectStore,
) -> None:
    """Tasks 0-7 start on v0 (steps 0 and 1), task 3 is slow: 0, 1, 2 and 4-7 finish, then
    tasks 8-11 (step 2, started once step 0 is trained) finish before 3. Before, the learner
    trained the first four groups to come: step 1 took one of step 2's groups, and task 3's
    group landed in step 2, two versions behind, and was dropped. Each step trains its own.
    Its history (the patch's marker in it) is test_replay.py's `training_run_ordered.json`."""
    suite = ScriptedSuite(train=12)
    tasks = [drawn_task(draw_order(suite.train, RUN.seed), i).id for i in range(12)]
    OneSlowTask.SLOW = tasks[3]
    trainer = ScriptedTrainer()
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, suite, trainer, agent_task=OneSlowTask),
    ):
        result, _ = await run_to_end(env.client, RUN, "train-order")
        history = await env.client.get_workflow_handle("train-order").fetch_history()
    assert not dropped(trainer, RUN), f"dropped as stale: {dropped(trainer, RUN)}"
    assert result.steps == RUN.steps
    assert {step: sorted(ids) for step, ids in trainer.steps.items()} == {
        step: sorted(tasks[step * 4 : step * 4 + 4]) for step in range(3)
    }
    markers = [e for e in history.events if e.HasField("marker_recorded_event_attributes")]
    assert any(ORDERED_GROUPS_PATCH.encode() in e.SerializeToString() for e in markers)
    await replay(history, TrainingRunWorkflow)
    if os.environ.get("TEMPERED_RECORD_HISTORIES"):
        (HISTORIES / "training_run_ordered.json").write_text(history.to_json())


@pytest.mark.asyncio
@pytest.mark.parametrize("redraws", [0, 5])
async def test_no_group_is_dropped_as_stale(store: ObjectStore, redraws: int) -> None:
    """Tasks of 1-30 units, 4 groups a step, one step ahead of the learner, a third of them
    flat (5 redrawn, or none), on a budget that continues the run as new: every group the
    learner trains is within `max_staleness`, each task's once, `steps × groups_per_step`."""
    grpo = RUN.grpo.model_copy(update={"redraw_flat_groups": redraws})
    run = RUN.model_copy(
        update={
            "run_id": f"order-{redraws}",
            "steps": 12,
            "grpo": grpo,
            "budget": HistoryBudget(events=400),
        }
    )
    trainer = ScriptedTrainer()
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, ScriptedSuite(train=60, flat_every=3), trainer),
    ):
        result, continued = await run_to_end(env.client, run, f"train-order-{redraws}")
        if redraws and os.environ.get("TEMPERED_RECORD_HISTORIES"):  # test_replay_ordered.py's
            histories = await run_histories(env.client, f"train-order-{redraws}")
            for name, history in zip(ORDERED_SEGMENTS, histories, strict=True):
                (HISTORIES / name).write_text(history.to_json())
    trained = trainer.trained()
    assert not dropped(trainer, run), f"dropped as stale: {dropped(trainer, run)}"
    assert continued, "no continue-as-new"
    assert (result.steps, result.redrawn) == (run.steps, redraws)
    assert len(trained) == len(set(trained)) == run.steps * grpo.groups_per_step
