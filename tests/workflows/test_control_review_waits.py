"""What a training run's waits wake on, and what they cost its history (time-skipping server,
scripted plane: tests/workflows/control_plane.py):

- a learner that reported an error (`learner_done`) fails the run at once, also while it waits
  for a task in flight that takes hours (`LEARNER_WAKES_PATCH`; before: after that task);
- a run waiting with nothing in flight pings its learner every `PROBE_EVERY`: it continues as
  new once its history budget is reached (`IDLE_BUDGET_PATCH`; before: ~7,000 events a day
  until Temporal terminated it), and counts its held-out tasks to come at a task's size, not
  at the pings' (a later review: 100 held-out tasks made segments of a few dozen events)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError

from contracts.errors import ErrorType, fail
from contracts.learner import GRPOConfig, HistoryBudget, TrainStepRequest, TrainStepResponse
from contracts.names import Activity, Queue
from contracts.run import LoadTasksResponse, RunResume, TrainingRunInput, draw_order, drawn_task
from infra.storage import ObjectStore
from tests.fixtures.learner_standins import BusyLearner, StalledLearner
from tests.fixtures.temporal import time_skipping_server
from tests.workflows.control_plane import (
    ScriptedSuite,
    ScriptedTrainer,
    StandInAgentTask,
    control_plane,
    run_histories,
)
from tests.workflows.test_training_run_children import failure
from workflows.training_run import TrainingRunWorkflow

RUN = TrainingRunInput(
    run_id="rv",
    steps=2,
    group_size=2,
    concurrency=4,
    grpo=GRPOConfig(groups_per_step=2, max_staleness=1),
)


class FailingTrainer(ScriptedTrainer):
    @activity.defn(name=Activity.TRAIN_STEP.value)
    async def train_step(self, request: TrainStepRequest) -> TrainStepResponse:
        raise fail(ErrorType.NON_FINITE_LOSS, f"step {request.step}: loss is nan")


LONG: set[str] = set()


@workflow.defn(name="AgentTaskWorkflow", sandboxed=False)
class SlowTailTask(StandInAgentTask):
    """Tasks in `LONG` take 5 h."""

    @workflow.run
    async def run(self, raw: dict[str, Any]) -> dict[str, Any]:
        if raw["task"]["id"] in LONG:
            await workflow.sleep(timedelta(hours=5))
        return await super().run(raw)


@pytest.mark.asyncio
async def test_a_learner_failure_fails_the_run_while_a_task_takes_hours(
    store: ObjectStore,
) -> None:
    suite = ScriptedSuite(train=10)
    order = draw_order(suite.train, RUN.seed)
    LONG.clear()
    LONG.update({drawn_task(order, 2).id, drawn_task(order, 3).id})  # step 1's two tasks
    run = RUN.model_copy(update={"run_id": "rv-lf"})
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, suite, FailingTrainer(), agent_task=SlowTailTask),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, run, id="train-rv-lf", task_queue=Queue.AGENT_TASKS
        )
        cause = await failure(handle, 60)
        history = await handle.fetch_history()
    assert isinstance(cause, ApplicationError) and cause.type == ErrorType.LEARNER_FAILED, cause
    assert "loss is nan" in cause.message, cause.message
    done = next(
        e
        for e in history.events
        if e.HasField("workflow_execution_signaled_event_attributes")
        and e.workflow_execution_signaled_event_attributes.signal_name == "learner_done"
    )
    waited = history.events[-1].event_time.ToDatetime() - done.event_time.ToDatetime()
    assert waited.total_seconds() < 60, waited  # before: the 5 h task's end


async def segments_over(
    run: TrainingRunInput, store: ObjectStore, suite: ScriptedSuite, learner: type, *, hours: int
) -> list[int]:
    """The events of each segment of `run` after `hours` of skipped time (it stays RUNNING)."""
    wid = f"train-{run.run_id}"
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, suite, ScriptedTrainer(), learner=learner),
    ):
        if run.resume is not None:  # the learner a resumed run finds by its workflow id
            await env.client.start_workflow(
                "LearnerWorkflow", {}, id=f"{wid}-learner", task_queue=Queue.AGENT_TASKS
            )
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, run, id=wid, task_queue=Queue.AGENT_TASKS
        )

        async def two_done() -> None:
            while (await handle.query(TrainingRunWorkflow.progress)).tasks_done < 2:
                await asyncio.sleep(0.05)

        if run.resume is None:
            await asyncio.wait_for(two_done(), 30)
        await asyncio.wait_for(env.sleep(timedelta(hours=hours)), 120)
        status = (await handle.describe()).status
        histories = await asyncio.wait_for(run_histories(env.client, wid), 60)
    assert status == WorkflowExecutionStatus.RUNNING, status
    return [len(h.events) for h in histories]


@pytest.mark.asyncio
async def test_a_run_waiting_on_a_stalled_learner_stays_within_its_budget(
    store: ObjectStore,
) -> None:
    """On-policy, its first groups sent, the learner never takes its step: 4 h of pings."""
    run = RUN.model_copy(
        update={
            "run_id": "rv-stall",
            "steps": 10,
            "concurrency": 2,
            "grpo": GRPOConfig(groups_per_step=2, max_staleness=0),
            "budget": HistoryBudget(events=200),
        }
    )
    lengths = await segments_over(run, store, ScriptedSuite(train=10), StalledLearner, hours=4)
    assert len(lengths) > 1, lengths  # before: one segment past its budget
    assert all(n <= run.budget.events for n in lengths), lengths


@pytest.mark.asyncio
async def test_held_out_tasks_ahead_are_counted_at_a_task_not_at_the_pings(
    store: ObjectStore,
) -> None:
    """A resumed run at its ending (no task to start) waits 4 h on a learner whose last step
    does not come, 100 held-out tasks ahead, on the default budget (10,240 events): ~120 pings
    of ~10 events and 100 tasks of `EVENTS_PER_TASK` fit one segment (the first idle look-ahead
    made segments of ~34-114 events)."""
    suite = ScriptedSuite(train=10, heldout=100)
    resume = RunResume(
        tasks=LoadTasksResponse(train=suite.train, heldout=suite.heldout),
        started=20,
        done=20,
        progress=[],
        evals=[],
        deadline=None,
        segment=1,
    )
    run = RUN.model_copy(
        update={
            "run_id": "rv-churn",
            "steps": 10,
            "concurrency": 2,
            "grpo": GRPOConfig(groups_per_step=2, max_staleness=0),
            "resume": resume,
        }
    )
    lengths = await segments_over(run, store, suite, BusyLearner, hours=4)
    assert len(lengths) == 1 and lengths[0] > 1000, lengths
