"""A run that is cancelled (or fails) cancels its learner until the cancel goes through
(`LearnerLink.cancel`, `CANCEL_RETRY_PATCH`), on the dev server (real time) with scripted tasks,
suite and train step (tests/workflows/control_plane.py).

A cancel by workflow id goes to the learner's current run and, like a signal
(workflows/signals.py), finds none while the learner continues as new. Before, the run's one
cancel failed there and was dropped: the learner (abandoned by design) ran on for good. The
window is reproduced by its effect: the run is resumed (segment 1) with no learner run under
its id when it is cancelled, and the learner's next run starts once the run's first cancel has
failed. (Not on the time-skipping server: its cancel of a workflow id with no run never
completes.) A learner that reported its end, or one gone for good, is not waited on past
`signal_run`'s retries."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle, WorkflowHistory
from temporalio.exceptions import CancelledError

from contracts.learner import LearnerDone
from contracts.names import Queue
from contracts.run import LoadTasksResponse, RunResume, TrainingRunInput
from infra.storage import ObjectStore
from tests.fixtures.learner_standins import BusyLearner, GatedAgentTask
from tests.fixtures.temporal import TemporalServer
from tests.workflows.control_plane import ScriptedSuite, ScriptedTrainer, control_plane
from tests.workflows.harness import connect
from tests.workflows.replaying import replay, replays_on_its_branch_only
from tests.workflows.test_training_run_children import failure, started_children
from tests.workflows.test_training_run_fails_at_once import RUN, patched
from workflows import learner_link
from workflows.learner_link import CANCEL_RETRY_PATCH
from workflows.signals import RETRY_DELAYS_S
from workflows.training_run import TrainingRunWorkflow

HISTORIES = Path(__file__).parent / "histories"
RECORDED = "training_run_learner_cancel_retried.json"
"""A run cancelled while its learner had no run; its cancel went through on a retry (written
by `test_a_cancelled_run_cancels_its_learner_once_it_has_a_run_again` with
TEMPERED_RECORD_HISTORIES=1)."""
SUITE = ScriptedSuite(train=10)
SHORT_DELAYS_S = (0.1, 0.2, 0.4, 0.8, 1.6)
"""`RETRY_DELAYS_S` shrunk tenfold, for the test that waits the whole schedule."""


def resumed(run_id: str) -> TrainingRunInput:
    """A second segment whose learner has not reported its end."""
    resume = RunResume(
        tasks=LoadTasksResponse(train=SUITE.train, heldout=SUITE.heldout),
        started=0,
        done=0,
        progress=[],
        evals=[],
        deadline=None,
        segment=1,
    )
    return RUN.model_copy(update={"run_id": run_id, "concurrency": 2, "resume": resume})


def cancels(history: WorkflowHistory) -> tuple[int, int]:
    """(cancels of its learner requested, of them failed) in `history`."""
    events = history.events
    asked = sum(
        e.HasField("request_cancel_external_workflow_execution_initiated_event_attributes")
        for e in events
    )
    failed = sum(
        e.HasField("request_cancel_external_workflow_execution_failed_event_attributes")
        for e in events
    )
    return asked, failed


async def cancelled_without_learner(client: Client, run_id: str) -> WorkflowHandle[Any, Any]:
    """Start the resumed run, its tasks held (`GatedAgentTask`: nothing goes to the learner),
    cancel it once both are in flight and return once its first cancel of the learner failed."""
    handle = await client.start_workflow(
        TrainingRunWorkflow.run, resumed(run_id), id=f"train-{run_id}", task_queue=Queue.AGENT_TASKS
    )
    await started_children(handle, 2)
    await handle.cancel()
    for _ in range(500):
        if cancels(await handle.fetch_history())[1]:
            return handle
        await asyncio.sleep(0.01)
    raise AssertionError("the run's cancel of its learner never failed")


def plane(client: Client, store: ObjectStore) -> Any:
    trainer = ScriptedTrainer()
    return control_plane(
        client, store, SUITE, trainer, agent_task=GatedAgentTask, learner=BusyLearner
    )


@pytest.mark.asyncio
async def test_a_cancelled_run_cancels_its_learner_once_it_has_a_run_again(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore
) -> None:
    """Before: the learner that started after the one failed cancel ran on for good."""
    client = await connect(temporal_server.address, namespace)
    async with plane(client, store):
        handle = await cancelled_without_learner(client, "cancel-retried")
        learner = await client.start_workflow(  # its next run (as after a continue-as-new)
            "LearnerWorkflow", {}, id=f"{handle.id}-learner", task_queue=Queue.AGENT_TASKS
        )
        cause = await failure(handle, 30)
        for _ in range(100):
            status = (await learner.describe()).status
            if status != WorkflowExecutionStatus.RUNNING:
                break
            await asyncio.sleep(0.05)
        history = await handle.fetch_history()

    assert isinstance(cause, CancelledError), cause
    assert status == WorkflowExecutionStatus.CANCELED, status  # before: RUNNING for good
    asked, failed = cancels(history)
    assert asked == failed + 1 and failed >= 1, (asked, failed)
    assert patched(history, CANCEL_RETRY_PATCH)
    await replay(history, TrainingRunWorkflow)
    if os.environ.get("TEMPERED_RECORD_HISTORIES"):
        (HISTORIES / RECORDED).write_text(history.to_json())


@pytest.mark.asyncio
async def test_a_learner_that_reported_its_end_is_no_longer_cancelled(
    temporal_server: TemporalServer, namespace: str, store: ObjectStore
) -> None:
    """Its `learner_done` comes while the run retries: the run ends then, cancelled."""
    client = await connect(temporal_server.address, namespace)
    async with plane(client, store):
        handle = await cancelled_without_learner(client, "cancel-ended")
        began = time.monotonic()
        await handle.signal(TrainingRunWorkflow.learner_done, LearnerDone())
        cause = await failure(handle, 30)
        took = time.monotonic() - began
        history = await handle.fetch_history()

    assert isinstance(cause, CancelledError), cause
    asked, failed = cancels(history)
    assert asked == failed <= 2, (asked, failed)  # the first, and maybe a retry before the signal
    assert took < RETRY_DELAYS_S[0] + RETRY_DELAYS_S[1], took
    await replay(history, TrainingRunWorkflow)


@pytest.mark.asyncio
async def test_a_learner_gone_for_good_is_cancelled_no_longer_than_a_signal_is_retried(
    temporal_server: TemporalServer,
    namespace: str,
    store: ObjectStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No learner run ever comes: the run tries once and after each of `RETRY_DELAYS_S`, then
    ends cancelled (before: it tried once). The schedule is `SHORT_DELAYS_S` here (3.1 s of
    real time, not 31 s): `LearnerLink.cancel` reads `RETRY_DELAYS_S` from its module at each
    cancel, and the workflow sandbox takes workflows.learner_link from the host (it is imported
    passed through), so the patch reaches the worker; were it not, the run would take 31 s and
    fail the bound on `took`."""
    monkeypatch.setattr(learner_link, "RETRY_DELAYS_S", SHORT_DELAYS_S)
    delays = learner_link.RETRY_DELAYS_S
    client = await connect(temporal_server.address, namespace)
    async with plane(client, store):
        handle = await cancelled_without_learner(client, "cancel-gone")
        cause = await failure(handle, sum(delays) + 20)
        history = await handle.fetch_history()

    assert isinstance(cause, CancelledError), cause
    assert cancels(history) == (len(delays) + 1,) * 2
    took = history.events[-1].event_time.ToDatetime() - history.events[0].event_time.ToDatetime()
    assert sum(delays) <= took.total_seconds() < sum(delays) + 10, took
    await replay(history, TrainingRunWorkflow)


@pytest.mark.asyncio
async def test_the_recorded_retry_replays_only_behind_its_patch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The recorded history replays; on its `branch_only` copy (tests/workflows/replaying.py)
    it replays with the patch answered True, and not on code without the retry (False): the
    retry changed the run's commands."""
    text = (HISTORIES / RECORDED).read_text()
    history = WorkflowHistory.from_json("train-cancel-retried", json.loads(text))
    assert patched(history, CANCEL_RETRY_PATCH)
    await replay(history, TrainingRunWorkflow)
    await replays_on_its_branch_only(
        monkeypatch, history, CANCEL_RETRY_PATCH, True, TrainingRunWorkflow
    )
