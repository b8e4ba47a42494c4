"""TrainingRunWorkflow's ends besides success, on the time-skipping test server (the cancel: on
the dev server) with scripted
tasks, suite and train step (tests/workflows/control_plane.py): a failed learner fails the run
(told by `learner_done`, also after the run continued as new), and a cancelled run cancels the
learner it started (which outlives the run's continues-as-new by design, not the run), a
learner cancelled by anyone else fails its run, a
learner that ended by itself before the run's `finish` landed is not a failure, a run told
to `stop` starts no more tasks but ends as a finished run does (also across continue-as-new),
and flat groups are redrawn up to the run's limit (dynamic sampling), across it too."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistory,
)
from temporalio.exceptions import CancelledError
from temporalio.service import RPCError, RPCStatusCode

from contracts.errors import ErrorType, fail
from contracts.learner import (
    GRPOConfig,
    HistoryBudget,
    LearnerDone,
    LearnerInput,
    TrainStepRequest,
    TrainStepResponse,
)
from contracts.names import Activity, Queue, Signal
from contracts.run import (
    LoadTasksResponse,
    RunResume,
    TrainingRunInput,
    TrainingRunResult,
    draw_order,
    drawn_task,
    redraws_allowed,
    spread,
)
from infra.storage import ObjectStore
from tests.fixtures.temporal import TemporalServer, time_skipping_server
from tests.workflows.control_plane import (
    ScriptedSuite,
    ScriptedTrainer,
    control_plane,
    run_to_end,
)
from tests.workflows.harness import connect
from workflows.training_run import TrainingRunWorkflow

RUN = TrainingRunInput(
    run_id="ends",
    steps=40,
    group_size=2,
    concurrency=8,
    grpo=GRPOConfig(groups_per_step=2, max_staleness=1),
    budget=HistoryBudget(events=400, bytes=256 * 1024),  # continues as new early
)


class DivergingTrainer(ScriptedTrainer):
    """Trains until `at`, then the loss is NaN (a non-retryable failure)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at = at

    @activity.defn(name=Activity.TRAIN_STEP.value)
    async def train_step(self, request: TrainStepRequest) -> TrainStepResponse:
        if request.step >= self.at:
            raise fail(ErrorType.NON_FINITE_LOSS, f"step {request.step}: loss is nan")
        return await super().train_step(request)


@pytest.mark.asyncio
async def test_a_failed_learner_fails_the_run(store: ObjectStore) -> None:
    trainer = DivergingTrainer(at=15)  # after the run has continued as new
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, ScriptedSuite(train=10), trainer),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, RUN, id="train-fails", task_queue=Queue.AGENT_TASKS.value
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
        first = (await handle.fetch_history()).events[0]
        attributes = first.workflow_execution_started_event_attributes
    assert attributes.continued_execution_run_id, "the run failed before it continued as new"
    assert "LearnerFailed" in repr(failed.value.cause) and "loss is nan" in repr(failed.value.cause)
    assert max(trainer.steps) == 14


@contextlib.asynccontextmanager
async def run_past_step(
    server: TemporalServer, namespace: str, store: ObjectStore, run_id: str, step: int
) -> AsyncIterator[tuple[Client, WorkflowHandle[Any, TrainingRunResult]]]:
    """RUN as `train-<run_id>` on the dev server, at the 10 ms pace, once its learner has taken
    `step` steps; its workers run for the `with` block."""
    trainer = ScriptedTrainer()
    client = await connect(server.address, namespace)
    async with control_plane(client, store, ScriptedSuite(train=10), trainer):
        handle = await client.start_workflow(
            TrainingRunWorkflow.run,
            RUN.model_copy(update={"run_id": run_id}),
            id=f"train-{run_id}",
            task_queue=Queue.AGENT_TASKS.value,
        )
        while len(trainer.steps) < step:
            await asyncio.sleep(0.02)
        yield client, handle


@pytest.mark.asyncio
async def test_a_cancelled_run_cancels_its_learner(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore
) -> None:
    """At the 10 ms pace the cancel lands while the learner is busy: in a step, or with its
    progress signal out, which spends the cancellation unless the learner raises it again
    (workflows/cancellation.py; before, it ran on in 5 of 6 runs, retrying signals to its closed
    run). On the dev server: the time-skipping one refuses the cancel of an activity whose
    result is on its way (ACTIVITY_UNKNOWN), and the learner then waits out its 60 s task
    timeout."""
    # after the run has continued as new
    async with run_past_step(temporal_server, namespace, store, "cancel", 15) as (client, run):
        await run.cancel()
        with pytest.raises(WorkflowFailureError):
            await run.result()
        learner = client.get_workflow_handle(f"{run.id}-learner")
        with pytest.raises(WorkflowFailureError) as ended:
            await asyncio.wait_for(learner.result(), timeout=20)
    assert isinstance(ended.value.cause, CancelledError), ended.value.cause


@pytest.mark.asyncio
async def test_a_learner_cancelled_on_its_own_fails_its_run(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore
) -> None:
    """Cancelled by anyone but its run, the learner says so (`learner_done`) and the run fails,
    instead of waiting for steps that never come (before: a cancel that found the learner
    waiting for groups ended it without a word)."""
    async with run_past_step(temporal_server, namespace, store, "lone", 3) as (client, run):
        await client.get_workflow_handle(f"{run.id}-learner").cancel()
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(run.result(), timeout=20)
    assert "LearnerFailed" in repr(failed.value.cause) and "cancelled" in repr(failed.value.cause)


async def last_segment(
    store: ObjectStore, run_id: str, *, started: int, learner_step: int, stopped: str | None = None
) -> tuple[TrainingRunResult, WorkflowHistory]:
    """A run's segment of a 2-step run over 4 tasks that starts with `started` of them done and
    its learner's `learner_done` already in (at `learner_step`), and no learner exists."""
    suite = ScriptedSuite(train=4)
    resume = RunResume(
        tasks=LoadTasksResponse(train=suite.train, heldout=[]),
        started=started,
        done=started,
        progress=[],
        evals=[],
        deadline=None,
        segment=3,
        stopped=stopped,
    )
    run = RUN.model_copy(update={"run_id": run_id, "steps": 2, "resume": resume})
    final = LearnerInput(run_id=run_id, max_steps=2, step=learner_step)
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, suite, ScriptedTrainer()),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run,
            run,
            id=f"train-{run_id}",
            task_queue=Queue.AGENT_TASKS.value,
            start_signal=Signal.LEARNER_DONE,
            start_signal_args=[LearnerDone(final=final)],
        )
        return await handle.result(), await handle.fetch_history()


@pytest.mark.asyncio
async def test_a_learner_that_ended_before_finish_is_not_a_failure(store: ObjectStore) -> None:
    """Having taken every step, the learner ends by itself, and may be gone before the run's
    `finish` lands (seen at 20,000 tasks). Made certain here: the run's last segment starts
    with every task done and its learner's `learner_done` already in, and no learner exists."""
    result, history = await last_segment(store, "ended", started=4, learner_step=2)
    assert (result.steps, result.tasks_done) == (2, 4)
    failed = [
        e
        for e in history.events
        if e.HasField("signal_external_workflow_execution_failed_event_attributes")
    ]
    assert len(failed) == 1, "the run's finish was expected to find no learner"


@pytest.mark.asyncio
async def test_a_stopped_run_starts_no_more_tasks_and_ends_as_usual(store: ObjectStore) -> None:
    """`stop` (what `tempered stop` sends), after the run has continued as new: the tasks
    in flight finish and are trained on, the learner takes its last step and ends, the final
    evaluation runs, and the result says why it ended early."""
    trainer = ScriptedTrainer()
    run = RUN.model_copy(update={"run_id": "ends-stop"})
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, ScriptedSuite(train=10, heldout=2), trainer),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, run, id="train-stop", task_queue=Queue.AGENT_TASKS.value
        )
        while len(trainer.steps) < 12:  # after the run has continued as new
            await env.sleep(0.05)  # a step or so of the stand-ins (10-300 ms tasks)
        await handle.signal(TrainingRunWorkflow.stop, "enough for today")
        result = await handle.result()
        progress = await handle.query(TrainingRunWorkflow.progress)
        learner = await env.client.get_workflow_handle("train-stop-learner").describe()
    trained = [task for groups in trainer.steps.values() for task in groups]
    assert result.stopped == "enough for today" and progress.stopping == "enough for today"
    assert 12 <= result.steps < run.steps, "the stop did not end the run early"
    assert result.tasks_started < run.steps * run.grpo.groups_per_step
    assert result.tasks_done == result.tasks_started == len(trained) == len(set(trained))
    assert learner.status == WorkflowExecutionStatus.COMPLETED
    assert [e.policy_version for e in result.evals] == [0, result.steps]


@pytest.mark.asyncio
async def test_a_stop_is_carried_through_continue_as_new(store: ObjectStore) -> None:
    """A segment that continues a stopped run (the stop landed while it drained) starts
    nothing: its learner is told to finish with what it has."""
    result, _ = await last_segment(store, "carried", started=2, learner_step=1, stopped="told")
    assert (result.tasks_started, result.steps, result.stopped) == (2, 1, "told")


def test_held_out_episodes_take_eval_max_turns_and_training_ones_max_turns() -> None:
    task = ScriptedSuite(train=1).train[0]
    run = RUN.model_copy(update={"max_turns": 3})
    assert run.eval_input(task, "e", 0).max_turns == run.task_input(task, 0).max_turns == 3
    one = run.model_copy(update={"eval_max_turns": 1})
    assert (one.eval_input(task, "e", 0).max_turns, one.task_input(task, 0).max_turns) == (1, 3)
    assert one.eval_input(task, "e", 0).group_size == 1
    assert one.task_input(task, 2).model_dump(include={"group_size", "policy_version"}) == {
        "group_size": RUN.group_size,
        "policy_version": 2,
    }


def test_spread_keeps_the_ends_and_the_spacing() -> None:
    tasks = ScriptedSuite(train=0, heldout=10).heldout
    assert [t.id for t in spread(tasks, 4)] == [tasks[i].id for i in (0, 2, 5, 7)]
    assert spread(tasks, 0) == spread(tasks, 10) == spread(tasks, 99) == tasks
    assert spread(tasks, 1) == tasks[:1]  # a limit of one is one task, not all of them


@pytest.mark.asyncio
async def test_heldout_limit_evaluates_the_same_spread_tasks_in_every_segment(
    store: ObjectStore,
) -> None:
    """`heldout_limit` 4 of 10 held-out tasks: the first eval (in the first segment) and the
    last (after the run continued as new) both run exactly the spread 4."""
    run = RUN.model_copy(update={"run_id": "spread", "steps": 12, "heldout_limit": 4})
    suite = ScriptedSuite(train=30, heldout=10)
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, suite, ScriptedTrainer()),
    ):
        result, continued = await run_to_end(env.client, run, "train-spread")
        evaluated = set()
        for task in suite.heldout:
            try:
                await env.client.get_workflow_handle(f"spread-eval-v0-{task.id}").describe()
                evaluated.add(task.id)
            except RPCError as err:
                assert err.status == RPCStatusCode.NOT_FOUND
    assert continued, "no continue-as-new"
    assert [(e.policy_version, e.tasks) for e in result.evals] == [(0, 4), (12, 4)]
    assert evaluated == {t.id for t in spread(suite.heldout, 4)}


@pytest.mark.asyncio
@pytest.mark.parametrize("redraws", [0, 5, 100])
async def test_flat_groups_are_redrawn_up_to_the_limit(store: ObjectStore, redraws: int) -> None:
    """A third of the tasks give flat groups. With `redraw_flat_groups` 5, five flat groups
    never reach the learner and five more tasks take their slots, so the learner still gets
    20 × 2 groups, each task once (the count survives continue-as-new); the five are spread
    over the run (one before the first step), so flat groups reach the first steps too. With
    100 (never used up), no flat group reaches it, also those that finish after every slot has
    started; with 0, every group is sent, flat or not."""
    grpo = RUN.grpo.model_copy(update={"redraw_flat_groups": redraws})
    run = RUN.model_copy(update={"run_id": f"flat-{redraws}", "steps": 20, "grpo": grpo})
    trainer, suite = ScriptedTrainer(), ScriptedSuite(train=30, flat_every=3)
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, suite, trainer),
    ):
        result, continued = await run_to_end(env.client, run, f"train-flat-{redraws}")
    trained, slots = trainer.trained(), run.steps * run.grpo.groups_per_step
    order = draw_order(suite.train, run.seed)
    started = [drawn_task(order, i).id for i in range(result.tasks_started)]
    not_trained = set(started) - set(trained)
    flat_trained = sum(t.startswith("flat-") for t in trained)
    assert continued, "no continue-as-new"
    assert (result.steps, len(trained)) == (run.steps, slots)
    assert result.tasks_done == result.tasks_started == slots + result.redrawn
    assert sorted(trained) == sorted(set(trained)) and set(trained) <= set(started)
    assert len(not_trained) == result.redrawn and all(t.startswith("flat-") for t in not_trained)
    early_flat = [t for step in range(3) for t in trainer.steps[step] if t.startswith("flat-")]
    if redraws == 100:
        assert flat_trained == 0 and 0 < result.redrawn < redraws
    else:
        assert result.redrawn == redraws and flat_trained >= 5, "no flat group was ever sent"
        assert early_flat, (
            "the first steps' flat groups were all redrawn: the budget was not spread"
        )


def test_the_redraw_budget_is_spread_over_the_steps() -> None:
    assert [redraws_allowed(8, 7, done) for done in range(7)] == [2, 3, 4, 5, 6, 7, 8]
    assert redraws_allowed(5, 20, 0) == 1 and redraws_allowed(5, 20, 19) == 5
    assert redraws_allowed(0, 7, 3) == 0 and redraws_allowed(100, 20, 0) == 5
