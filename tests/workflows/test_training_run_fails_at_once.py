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
  continue-as-new's drain), after training on; now it fails with TASK_FAILED, naming the task."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from contracts.errors import ErrorType
from contracts.learner import GRPOConfig
from contracts.names import Queue, Signal
from contracts.run import TrainingRunInput
from infra.storage import ObjectStore
from tests.fixtures.temporal import time_skipping_server
from tests.workflows.control_plane import ScriptedSuite, ScriptedTrainer, control_plane
from tests.workflows.replaying import replay
from tests.workflows.test_training_run import FailingAgentTask
from tests.workflows.test_training_run_children import failure
from workflows.learner_link import PROBE_EVERY, PROBE_PATCH
from workflows.run_failure import FAILS_AT_ONCE_PATCH
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
    trainer = ScriptedTrainer()
    run = RUN.model_copy(update={"run_id": "learner-lost", "concurrency": 2})  # a short history
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, ScriptedSuite(train=40), trainer),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, run, id="train-learner-lost", task_queue=Queue.AGENT_TASKS
        )
        while not trainer.steps:
            await env.sleep(0.05)
        learner = env.client.get_workflow_handle(f"{handle.id}-learner")
        await learner.terminate("an operator ended it")
        cause = await failure(handle, 60)  # before: it waited for good
        history, ended = await handle.fetch_history(), await learner.fetch_history()

    assert isinstance(cause, ApplicationError) and cause.type == ErrorType.LEARNER_FAILED, cause
    assert cause.message.startswith("the learner cannot be reached: "), cause.message
    # in the server's time: a signal's retries after the learner's end, and a little more
    waited = history.events[-1].event_time.ToDatetime() - ended.events[-1].event_time.ToDatetime()
    assert waited.total_seconds() < sum(RETRY_DELAYS_S) + 10, waited
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


@workflow.defn(name="LearnerWorkflow", sandboxed=False)
class StalledLearner:
    """A learner that takes every signal and never takes a step (one whose step outlasts the
    run's patience), with no activity running (the time-skipping server skips no time once a
    workflow is terminated with one running); told to `finish`, it ends as it began."""

    def __init__(self) -> None:
        self.finished = False

    @workflow.run
    async def run(self, raw: dict[str, Any]) -> dict[str, Any]:
        await workflow.wait_condition(lambda: self.finished)
        return raw

    @workflow.signal(dynamic=True)
    def any_signal(self, name: str, args: Sequence[RawValue]) -> None:
        self.finished |= name == Signal.FINISH


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
    when a wait woke, so it waited for good)."""
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

    assert (result.tasks_started, result.steps) == (2, 0), result
    took = history.events[-1].event_time.ToDatetime() - history.events[0].event_time.ToDatetime()
    assert 600 <= took.total_seconds() < 600 + PROBE_EVERY.total_seconds(), took
    assert patched(history, PROBE_PATCH)
