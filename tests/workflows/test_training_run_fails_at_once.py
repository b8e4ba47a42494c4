"""A training run fails as soon as it cannot go on (workflows/run_failure.py,
`FAILS_AT_ONCE_PATCH`), on the time-skipping test server with scripted tasks, suite and train
step (tests/workflows/control_plane.py):

- its learner ended without `learner_done` (terminated from the UI or the CLI): before, the
  rollouts' `add_groups` failed in tasks nobody awaited, and the run waited for the learner's
  steps for good, with nothing in flight; now it fails with LEARNER_FAILED once a signal to the
  learner has failed after its retries (`signal_run`, 31 s). Terminated while the run waits for
  its step with nothing in flight (no signal to fail), it is found by the run's probe
  (`PROBE_PATCH`, a ping every `PROBE_EVERY`);
- a held-out task's child failed: before, the run noticed it at its end (or the next
  continue-as-new's drain), after training on; now it fails with TASK_FAILED, naming the task.
  Also while the run waits for its learner's last steps (`ENDING_WAKES_PATCH`): before, it waited for
  them first;
- its learner ended with no error before the run's steps (told `finish` by someone else): before,
  the run's wait for the learner spun in one activation (a TMPRL1101 deadlock, the run stuck
  RUNNING); now it fails with LEARNER_FAILED, saying at which step the learner ended."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.client import WorkflowHistory
from temporalio.exceptions import ApplicationError, CancelledError

from contracts.errors import ErrorType, fail
from contracts.learner import GRPOConfig, LearnerProgress, TrainStepRequest, TrainStepResponse
from contracts.names import Activity, Queue, Signal, eval_run_id
from contracts.run import LoadTasksResponse, RunResume, TrainingRunInput
from infra.storage import ObjectStore
from tests.fixtures.learner_standins import (
    BusyLearner,
    GatedAgentTask,
    StalledLearner,
    quiet,
    release,
)
from tests.fixtures.temporal import TemporalServer, time_skipping_server
from tests.workflows.control_plane import (
    ScriptedSuite,
    ScriptedTrainer,
    StandInAgentTask,
    control_plane,
)
from tests.workflows.harness import connect
from tests.workflows.replaying import replay
from tests.workflows.test_training_run import FailingAgentTask
from tests.workflows.test_training_run_children import failure, started_children
from workflows.learner import LearnerWorkflow
from workflows.learner_link import PROBE_EVERY, PROBE_PATCH
from workflows.run_failure import ENDING_WAKES_PATCH, FAILS_AT_ONCE_PATCH
from workflows.signals import RETRY_DELAYS_S
from workflows.training_run import TrainingRunWorkflow

HISTORIES = Path(__file__).parent / "histories"
RUN = TrainingRunInput(
    run_id="at-once",
    steps=30,  # far more than the run takes before it fails, on the default (large) budget
    group_size=2,
    concurrency=4,
    grpo=GRPOConfig(groups_per_step=2, max_staleness=1),
)


def patched(history: WorkflowHistory, patch: str = FAILS_AT_ONCE_PATCH) -> bool:
    markers = [e for e in history.events if e.HasField("marker_recorded_event_attributes")]
    return any(patch.encode() in e.SerializeToString() for e in markers)


async def checked(history: WorkflowHistory, recorded_as: str | None = None) -> None:
    """Its patch marker is in `history`, which replays (test_replay.py replays it as
    `recorded_as`, written here with TEMPERED_RECORD_HISTORIES=1)."""
    assert patched(history)
    await replay(history, TrainingRunWorkflow)
    if recorded_as and os.environ.get("TEMPERED_RECORD_HISTORIES"):
        (HISTORIES / recorded_as).write_text(history.to_json())


@pytest.mark.asyncio
async def test_a_run_whose_learner_was_terminated_fails_within_its_signal_retries(
    store: ObjectStore,
) -> None:
    """The learner is terminated after its first step, with the groups of the next tasks held
    back until then (`GatedAgentTask`: no step of it runs as it ends, tests/fixtures/
    learner_standins.py); their `add_groups` then fails after its retries."""
    trainer = ScriptedTrainer()
    run = RUN.model_copy(update={"run_id": "learner-lost", "concurrency": 2})  # a short history
    async with (
        time_skipping_server() as env,
        control_plane(
            env.client, store, ScriptedSuite(train=40), trainer, agent_task=GatedAgentTask
        ),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, run, id="train-learner-lost", task_queue=Queue.AGENT_TASKS
        )
        await release(env.client, await started_children(handle, 2))  # the first step's groups
        learner = env.client.get_workflow_handle(f"{handle.id}-learner")
        await quiet(learner, trainer, steps=1)
        held = (await started_children(handle, 4))[2:]  # the next two, in flight
        await learner.terminate("an operator ended it")
        await release(env.client, held)
        began = time.monotonic()
        cause = await failure(handle, 60)  # before: it waited for good
        took = time.monotonic() - began
        history, ended = await handle.fetch_history(), await learner.fetch_history()

    assert isinstance(cause, ApplicationError) and cause.type == ErrorType.LEARNER_FAILED, cause
    assert cause.message.startswith("the learner cannot be reached: "), cause.message
    # in the server's time: a signal's retries after the learner's end, and a little more
    waited = history.events[-1].event_time.ToDatetime() - ended.events[-1].event_time.ToDatetime()
    assert waited.total_seconds() < sum(RETRY_DELAYS_S) + 10, waited
    assert took < sum(RETRY_DELAYS_S) - 6, took  # the retries' timers were skipped
    await checked(history, "training_run_learner_lost.json")


@pytest.mark.asyncio
async def test_a_failed_held_out_task_fails_the_run_at_once(store: ObjectStore) -> None:
    """The held-out task fails in the evaluation of version 0, before training: the run fails
    then, not after its 30 steps."""
    trainer = ScriptedTrainer()
    run = RUN.model_copy(update={"run_id": "eval-fails"})
    suite = ScriptedSuite(train=10, heldout=2)
    FailingAgentTask.FAILS = bad = suite.heldout[1].id
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, suite, trainer, agent_task=FailingAgentTask),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, run, id="train-eval-fails", task_queue=Queue.AGENT_TASKS
        )
        cause = await failure(handle, 60)
        history = await handle.fetch_history()

    assert isinstance(cause, ApplicationError) and cause.type == ErrorType.TASK_FAILED, cause
    assert cause.message.startswith(f"held-out task {bad} (evaluation of version 0): ")
    assert len(trainer.steps) < run.steps // 2, trainer.steps  # before: every step, then failed
    await checked(history)  # test_training_run_children.py records a held-out task failing


@pytest.mark.asyncio
async def test_a_learner_terminated_while_nothing_is_in_flight_fails_the_run(
    store: ObjectStore,
) -> None:
    """On-policy, the run's first groups are sent and it waits for the learner's first step
    with nothing in flight: no signal would fail. The learner is terminated in that step; the
    run's probe finds it gone within `PROBE_EVERY` and the signal's retries (before: it waited
    for good)."""
    trainer = ScriptedTrainer()
    run = RUN.model_copy(
        update={"run_id": "learner-idle", "grpo": GRPOConfig(groups_per_step=2, max_staleness=0)}
    )
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, ScriptedSuite(train=10), trainer, learner=StalledLearner),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, run, id="train-learner-idle", task_queue=Queue.AGENT_TASKS
        )
        while (progress := await handle.query(TrainingRunWorkflow.progress)).tasks_done < 2:
            await asyncio.sleep(0.05)
        assert progress.in_flight == 0 and progress.tasks_started == 2, progress
        learner = env.client.get_workflow_handle(f"{handle.id}-learner")
        await quiet(learner, trainer, steps=0)  # the groups' signals taken
        await learner.terminate("an operator ended it mid-step")
        cause = await failure(handle, 60)  # before: it waited for good
        history, ended = await handle.fetch_history(), await learner.fetch_history()

    assert isinstance(cause, ApplicationError) and cause.type == ErrorType.LEARNER_FAILED, cause
    waited = history.events[-1].event_time.ToDatetime() - ended.events[-1].event_time.ToDatetime()
    bound = PROBE_EVERY.total_seconds() + sum(RETRY_DELAYS_S) + 10
    assert waited.total_seconds() < bound, waited
    assert patched(history, PROBE_PATCH)
    await checked(history, "training_run_learner_probed.json")


@pytest.mark.asyncio
async def test_a_run_waiting_with_nothing_in_flight_ends_at_its_time_budget(
    store: ObjectStore,
) -> None:
    """The learner never takes its first step; the run, waiting for it with nothing in flight,
    stops rolling out at its time budget's deadline and ends (before: the budget was read only
    when a wait woke, so it waited for good), and says why it ended before its steps (before:
    `stopped` None, as if it had taken them)."""
    run = RUN.model_copy(
        update={
            "run_id": "budget-idle",
            "time_budget_s": 600,
            "grpo": GRPOConfig(groups_per_step=2, max_staleness=0),
        }
    )
    async with (
        time_skipping_server() as env,
        control_plane(
            env.client, store, ScriptedSuite(train=10), ScriptedTrainer(), learner=StalledLearner
        ),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, run, id="train-budget-idle", task_queue=Queue.AGENT_TASKS
        )
        result = await asyncio.wait_for(handle.result(), 60)
        history = await handle.fetch_history()
        progress = await handle.query(TrainingRunWorkflow.progress)

    assert (result.tasks_started, result.steps) == (2, 0), result
    assert result.stopped == progress.stopping == "time budget spent", result
    took = history.events[-1].event_time.ToDatetime() - history.events[0].event_time.ToDatetime()
    assert 600 <= took.total_seconds() < 600 + PROBE_EVERY.total_seconds(), took
    assert patched(history, PROBE_PATCH)


@pytest.mark.asyncio
async def test_a_learner_that_ended_before_the_runs_steps_fails_the_run(store: ObjectStore) -> None:
    """Told `finish` by someone else (the signal is public), the learner ends at its step k of
    n, with `learner_done` and no error; the run, on-policy, waits for step k + 1 with nothing
    in flight (before: that wait spun in one activation, a TMPRL1101 deadlock)."""
    trainer = ScriptedTrainer()
    run = RUN.model_copy(
        update={
            "run_id": "learner-ended",
            "steps": 10,
            "concurrency": 2,
            "grpo": GRPOConfig(groups_per_step=2, max_staleness=0),
        }
    )
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, ScriptedSuite(train=40), trainer),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, run, id="train-learner-ended", task_queue=Queue.AGENT_TASKS
        )
        while not trainer.steps:
            await env.sleep(0.05)
        learner = env.client.get_workflow_handle(f"{handle.id}-learner")
        await learner.signal(Signal.FINISH)
        ended = await learner.result()
        cause = await failure(handle, 30)  # before: RUNNING for good
        history = await handle.fetch_history()

    assert isinstance(cause, ApplicationError) and cause.type == ErrorType.LEARNER_FAILED, cause
    assert cause.message == f"the learner ended at step {ended['step']} of {run.steps}", cause
    assert ended["step"] < run.steps
    await replay(history, TrainingRunWorkflow)


@workflow.defn(name="AgentTaskWorkflow", sandboxed=False)
class HeldOutFailsWhenTold(StandInAgentTask):
    """The stand-in, but the held-out tasks of the evaluation of version `VERSION` wait until
    signalled `fail`, then fail for good."""

    VERSION = 0

    def __init__(self) -> None:
        self._fail = False

    @workflow.signal(name="fail")
    def fail_now(self) -> None:
        self._fail = True

    @workflow.run
    async def run(self, raw: dict[str, Any]) -> dict[str, Any]:
        if raw.get("run_id", "").endswith(f"-eval-v{self.VERSION}"):
            await workflow.wait_condition(lambda: self._fail)
            raise fail(ErrorType.INVALID_TASK, "its tests are broken")
        return await super().run(raw)


class HeldTrainer(ScriptedTrainer):
    """`train_step`, but step `at` waits for `released` (a long last step)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.holding, self.released = at, asyncio.Event(), asyncio.Event()

    @activity.defn(name=Activity.TRAIN_STEP.value)
    async def train_step(self, request: TrainStepRequest) -> TrainStepResponse:
        if request.step == self.at:
            self.holding.set()
            await self.released.wait()
        return await super().train_step(request)


ENDING = RUN.model_copy(update={"steps": 3, "eval_every": 1})
"""Every task started by the learner's last step, an evaluation after each step."""


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("segment", "end"), [("first", "fails"), ("resumed", "fails"), ("first", "cancelled")]
)
async def test_a_held_out_task_failing_as_the_run_waits_for_its_learner_fails_it_at_once(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore, segment: str, end: str
) -> None:
    """Every task done, the run waits for its learner's last step: in the `first` segment the
    learner's result (its child), in a `resumed` one its `learner_done` (`LearnerLink.final`).
    A held-out task of the evaluation then running `fails`: the run fails at once and cancels
    the learner (before: it waited for the learner's last step, here for good). Or the run is
    `cancelled` there: it cancels the learner, as it did before the wait woke on failures. On
    the dev server, real time: the learner's step waits for the test."""
    client = await connect(temporal_server.address, namespace)
    suite = ScriptedSuite(train=10, heldout=1)
    run = ENDING.model_copy(update={"run_id": f"ending-{segment}-{end}"})
    trainer, learner = HeldTrainer(at=2), None
    if segment == "resumed":  # continued as new with every task done, its learner busy
        resume = RunResume(
            tasks=LoadTasksResponse(train=suite.train, heldout=suite.heldout),
            started=6,
            done=6,
            progress=[],
            evals=[],
            deadline=None,
            segment=1,
        )
        run, learner = run.model_copy(update={"resume": resume}), BusyLearner
    HeldOutFailsWhenTold.VERSION = 2
    workflow_id = f"train-{run.run_id}"
    plane = control_plane(
        client,
        store,
        suite,
        trainer,
        agent_task=HeldOutFailsWhenTold,
        learner=learner or LearnerWorkflow,
    )
    try:
        async with plane:
            if learner is not None:
                await client.start_workflow(
                    "LearnerWorkflow", {}, id=f"{workflow_id}-learner", task_queue=Queue.AGENT_TASKS
                )
            handle = await client.start_workflow(
                TrainingRunWorkflow.run, run, id=workflow_id, task_queue=Queue.AGENT_TASKS
            )
            if learner is None:
                await asyncio.wait_for(trainer.holding.wait(), 30)
            else:  # the learner's step 2 published version 2: its evaluation starts
                progress = LearnerProgress(step=2, policy_version=2, trained_groups=4)
                await handle.signal(TrainingRunWorkflow.learner_progress, progress)
            held_out = eval_run_id(run.run_id, 2) + f"-{suite.heldout[0].id}"
            assert held_out in await started_children(handle, 1 if learner else 9)
            state = await handle.query(TrainingRunWorkflow.progress)
            assert (state.tasks_done, state.in_flight) == (6, 0), state
            if end == "cancelled":
                await handle.cancel()
            else:
                await client.get_workflow_handle(held_out).signal("fail")
            cause = await failure(handle, 15)  # before: when the learner's step ended
            history = await handle.fetch_history()
    finally:
        trainer.released.set()

    if end == "cancelled":
        assert isinstance(cause, CancelledError), cause
    else:
        assert isinstance(cause, ApplicationError) and cause.type == ErrorType.TASK_FAILED, cause
        assert cause.message.startswith("held-out task heldout-0 (evaluation of version 2): ")
    cancels = [
        e.request_cancel_external_workflow_execution_initiated_event_attributes
        for e in history.events
        if e.HasField("request_cancel_external_workflow_execution_initiated_event_attributes")
    ]
    assert {c.workflow_execution.workflow_id for c in cancels} == {f"{workflow_id}-learner"}
    assert patched(history, ENDING_WAKES_PATCH)
    await replay(history, TrainingRunWorkflow)
