"""A training run's held-out evaluations beside its other children:

- Temporal fails the workflow task that would start a workflow's 2,001st pending child
  (`PendingChildWorkflowsLimitExceeded`), on every retry: the run counts every child it has
  pending (its training tasks, its evaluations' held-out tasks and, in the segment that started
  it, its learner) and starts none past `MAX_PENDING_CHILDREN`, and one evaluation starts at
  most `EVAL_WINDOW` of its held-out tasks at a time (`PENDING_CHILDREN_PATCH`). Before, only
  `concurrency` bounded the training tasks, and each evaluation started all its held-out tasks
  at once. Here both bounds are lowered (the test server enforces no limit of its own) and the
  run's history is read for what it had pending;
- what a continue-as-new carries of the evaluations keeps version 0's (the baseline), not the
  first to finish, which a later version's can be (`BASELINE_PATCH`).

On the time-skipping test server with scripted tasks, suite and train step
(tests/workflows/control_plane.py), and on the dev server for the kept evaluations."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.worker import Worker

from contracts.evaluation import EvalResult
from contracts.learner import GRPOConfig
from contracts.names import Queue, eval_run_id
from contracts.run import TrainingRunInput
from infra.storage import ObjectStore
from tests.fixtures.temporal import TemporalServer, time_skipping_server
from tests.workflows.control_plane import ScriptedSuite, ScriptedTrainer, control_plane
from tests.workflows.harness import connect
from tests.workflows.replaying import replay
from workflows import children, evaluations
from workflows.children import PendingChildren
from workflows.evaluations import BASELINE_PATCH, EVAL_TAIL, Evaluations
from workflows.retention import Retention
from workflows.training_run import TrainingRunWorkflow

CLOSED = [
    "child_workflow_execution_completed_event_attributes",
    "child_workflow_execution_failed_event_attributes",
    "child_workflow_execution_canceled_event_attributes",
    "child_workflow_execution_terminated_event_attributes",
    "child_workflow_execution_timed_out_event_attributes",
]


def most_pending(history: WorkflowHistory, prefix: str = "") -> int:
    """The most children whose workflow ids start with `prefix` the run had pending at once."""
    pending: set[str] = set()
    most = 0
    for event in history.events:
        if event.HasField("start_child_workflow_execution_initiated_event_attributes"):
            started = event.start_child_workflow_execution_initiated_event_attributes.workflow_id
            if started.startswith(prefix):
                pending.add(started)
        elif event.HasField("start_child_workflow_execution_failed_event_attributes"):
            pending.discard(
                event.start_child_workflow_execution_failed_event_attributes.workflow_id
            )
        for field in CLOSED:
            if event.HasField(field):
                pending.discard(getattr(event, field).workflow_execution.workflow_id)
        most = max(most, len(pending))
    return most


def marked(history: WorkflowHistory, patch: str) -> bool:
    markers = [e for e in history.events if e.HasField("marker_recorded_event_attributes")]
    return any(patch.encode() in e.SerializeToString() for e in markers)


@pytest.mark.asyncio
async def test_a_run_keeps_its_pending_children_within_the_limit(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """4 pending children at most (the learner, 4 training tasks in flight, 5 held-out tasks an
    evaluation, one after each step: before, 1 + 4 + 5 and more at once), 2 of an evaluation."""
    monkeypatch.setattr(children, "MAX_PENDING_CHILDREN", 4)
    monkeypatch.setattr(evaluations, "EVAL_WINDOW", 2)
    run = TrainingRunInput(
        run_id="pending",
        steps=3,
        group_size=2,
        concurrency=4,
        eval_every=1,
        grpo=GRPOConfig(groups_per_step=2, max_staleness=1),
    )
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, ScriptedSuite(train=10, heldout=5), ScriptedTrainer()),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, run, id="train-pending", task_queue=Queue.AGENT_TASKS
        )
        result = await handle.result()
        history = await handle.fetch_history()

    assert [(e.policy_version, e.tasks) for e in result.evals] == [(v, 5) for v in range(4)]
    assert result.tasks_done == 6
    assert most_pending(history) == 4  # reached, never passed
    for version in range(4):
        assert most_pending(history, eval_run_id(run.run_id, version) + "-") <= 2
    assert marked(history, children.PENDING_CHILDREN_PATCH)
    await replay(history, TrainingRunWorkflow)


def result(version: int) -> EvalResult:
    return EvalResult(policy_version=version, pass_at_1=version / 100, tasks=4)


@workflow.defn(name="KeptEvaluations", sandboxed=False)
class KeptEvaluations:
    """What a run's continue-as-new carries of `results` (in the order they finished)."""

    @workflow.run
    async def run(self, results: list[EvalResult]) -> list[EvalResult]:
        run_input = TrainingRunInput(run_id="kept")
        retention, pending = Retention(run_input, 1), PendingChildren()
        return Evaluations(run_input, results, retention, _no_task, _no_error, pending).kept()


async def _no_task(*_: Any) -> Any:
    raise AssertionError("no evaluation runs here")


def _no_error(*_: Any) -> None:
    return None


@pytest.mark.asyncio
async def test_a_continue_as_new_keeps_the_baseline_evaluation(
    temporal_server: TemporalServer, namespace: str
) -> None:
    """Version 0's evaluation finished second (after version 1's, its held-out tasks slower):
    with 35 results, before, the first to finish (version 1's) was kept and version 0's fell
    out of the last `EVAL_TAIL`; in order, nothing changes and no marker is recorded."""
    client = await connect(temporal_server.address, namespace)
    late = [result(1), result(0), *(result(v) for v in range(2, 35))]
    in_order = sorted(late, key=lambda e: e.policy_version)
    kept: dict[str, list[EvalResult]] = {}
    histories: dict[str, WorkflowHistory] = {}
    async with Worker(client, task_queue="kept", workflows=[KeptEvaluations]):
        for name, results in (("late", late), ("in-order", in_order)):
            handle = await client.start_workflow(
                KeptEvaluations.run, results, id=f"kept-{name}", task_queue="kept"
            )
            kept[name] = await asyncio.wait_for(handle.result(), 30)
            histories[name] = await handle.fetch_history()

    versions = [e.policy_version for e in kept["late"]]
    assert versions == [0, *range(3, 35)], versions  # before: [1, 3, 4, …, 34]
    assert len(versions) == 1 + EVAL_TAIL
    assert marked(histories["late"], BASELINE_PATCH)
    assert [e.policy_version for e in kept["in-order"]] == [0, *range(3, 35)]
    assert not marked(histories["in-order"], BASELINE_PATCH)
