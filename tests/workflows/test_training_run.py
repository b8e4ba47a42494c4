"""TrainingRunWorkflow's ends besides success, on the time-skipping test server (the cancel: on
the dev server) with scripted tasks, suite and train step (tests/workflows/control_plane.py): a
failed learner fails the run (told by `learner_done`, also after the run continued as new), and
so does a failed task (which an on-policy run waited for); a cancelled run cancels the learner
it started (which outlives the run's continues-as-new by design, not the run), a learner
cancelled by anyone else fails its run, a learner that ended by itself before the run's `finish`
landed, or while the run drained before continuing as new, is not a failure, and a run told to
`stop` starts no more tasks but ends as a finished run does (also across continue-as-new),
evaluating its last version once. Which tasks a run draws: test_training_run_draws.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistory,
)
from temporalio.exceptions import ApplicationError, CancelledError

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
)
from infra.storage import ObjectStore
from tests.fixtures.temporal import TemporalServer, time_skipping_server
from tests.workflows.control_plane import (
    ScriptedSuite,
    ScriptedTrainer,
    StandInAgentTask,
    control_plane,
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


@workflow.defn(name="AgentTaskWorkflow", sandboxed=False)
class FailingAgentTask(StandInAgentTask):
    """The stand-in, but the task `FAILS` fails for good (as a task whose tests are broken)."""

    FAILS = ""

    @workflow.run
    async def run(self, raw: dict[str, Any]) -> dict[str, Any]:
        if raw["task"]["id"] == self.FAILS:
            raise fail(ErrorType.INVALID_TASK, f"task {self.FAILS}: its tests wrote no reward")
        return await super().run(raw)


@pytest.mark.asyncio
async def test_a_failed_task_fails_the_run_which_would_wait_for_its_group(
    store: ObjectStore,
) -> None:
    """On-policy (`max_staleness` 0), the second step's tasks wait for the first step, which
    waits for the group of the first task drawn: that task fails, so before, the run waited for
    good. It fails now, naming the task."""
    run = RUN.model_copy(
        update={"run_id": "task-fails", "grpo": RUN.grpo.model_copy(update={"max_staleness": 0})}
    )
    suite = ScriptedSuite(train=10)
    FailingAgentTask.FAILS = drawn_task(draw_order(suite.train, run.seed), 0).id
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, suite, ScriptedTrainer(), agent_task=FailingAgentTask),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, run, id="train-task-fails", task_queue=Queue.AGENT_TASKS.value
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), timeout=60)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ErrorType.TASK_FAILED, cause
    bad = FailingAgentTask.FAILS
    assert cause.message == f"task {bad}: InvalidTask: task {bad}: its tests wrote no reward"


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
    store: ObjectStore,
    run_id: str,
    *,
    started: int,
    learner_step: int,
    stopped: str | None = None,
    heldout: int = 0,
    deadline: datetime | None = None,
) -> tuple[TrainingRunResult, WorkflowHistory]:
    """A run's segment of a 2-step run over 4 tasks that starts with `started` of them done and
    its learner's `learner_done` already in (at `learner_step`), and no learner exists; with
    `heldout` tasks and the smallest history budget (so its ending may continue as new)."""
    suite = ScriptedSuite(train=4, heldout=heldout)
    resume = RunResume(
        tasks=LoadTasksResponse(train=suite.train, heldout=suite.heldout),
        started=started,
        done=started,
        progress=[],
        evals=[],
        deadline=deadline,
        segment=3,
        stopped=stopped,
    )
    budget = HistoryBudget(events=200) if heldout else RUN.budget
    run = RUN.model_copy(
        update={"run_id": run_id, "steps": 2, "resume": resume, "budget": budget, "eval_every": 0}
    )
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
async def test_a_learner_that_ended_while_the_run_drained_is_carried_through_continue_as_new(
    store: ObjectStore,
) -> None:
    """The learner may take its last step and end while the run drains before its ending's
    continue-as-new (e.g. behind a long evaluation); its `learner_done` must reach the next
    segment, which would otherwise signal a learner that is gone and fail. Made certain: the
    segment starts the last task with the learner's `learner_done` in, and its ending (16
    held-out tasks to evaluate, the smallest budget) continues as new."""
    result, history = await last_segment(store, "drained", started=3, learner_step=2, heldout=16)
    assert history.events[0].workflow_execution_started_event_attributes.continued_execution_run_id
    assert (result.steps, result.tasks_started, result.tasks_done) == (2, 4, 4)


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
async def test_a_run_stopped_on_an_evaluated_step_evaluates_it_once(store: ObjectStore) -> None:
    """With `eval_every` 1 every step's version is evaluated, the stopped run's last one too:
    its `learner_progress` starts that evaluation, and the run's ending asked for it again
    while it ran (its children's ids taken: the run failed)."""
    trainer = ScriptedTrainer()
    run = RUN.model_copy(update={"run_id": "stop-eval", "eval_every": 1})
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, ScriptedSuite(train=10, heldout=2), trainer),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, run, id="train-stop-eval", task_queue=Queue.AGENT_TASKS.value
        )
        while len(trainer.steps) < 3:
            await env.sleep(0.05)
        await handle.signal(TrainingRunWorkflow.stop, "enough")
        result = await handle.result()
    versions = [e.policy_version for e in result.evals]
    assert result.steps < run.steps and versions[-1] == result.steps
    assert versions == sorted(set(versions)), versions


@pytest.mark.asyncio
async def test_a_stop_is_carried_through_continue_as_new(store: ObjectStore) -> None:
    """A segment that continues a stopped run (the stop landed while it drained) starts
    nothing: its learner is told to finish with what it has."""
    result, _ = await last_segment(store, "carried", started=2, learner_step=1, stopped="told")
    assert (result.tasks_started, result.steps, result.stopped) == (2, 1, "told")


@pytest.mark.asyncio
async def test_a_segment_past_its_time_budget_says_so(store: ObjectStore) -> None:
    """A run that continued as new with its deadline passed starts nothing and says why it
    ended before its steps (before: `stopped` None, as a run that took them all)."""
    past = datetime(2000, 1, 1, tzinfo=UTC)
    run, _ = await last_segment(store, "budget", started=2, learner_step=1, deadline=past)
    assert (run.tasks_started, run.steps, run.stopped) == (2, 1, "time budget spent")


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
