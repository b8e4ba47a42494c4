"""A group whose rewards differ by round-off only is redrawn behind `FLAT_ROUNDOFF_PATCH`
(workflows/training_run.py, c97ed5a), and histories on both sides of it replay, on the
time-skipping test server with scripted tasks, suite and train step
(tests/workflows/control_plane.py, whose flat groups are round-off apart: 0.1 · 3 and 0.3).

The run: 1 step of 2 groups, 2 at a time, every task flat, one redraw allowed. This code
redraws the first group to end (the patch's marker) and starts a third task;
`contracts.learner.has_signal` took such a group for a signal before b84b027 (`max != min`),
so the release before sent it, and started two tasks only.

- `training_run_flat_roundoff_redrawn.json`: this code's (`test_record`,
  TEMPERED_RECORD_HISTORIES=1).
- `training_run_flat_roundoff_sent_before.json`: the release before b84b027 (`git archive
  b84b027^`, its control_plane.py's stand-in given c97ed5a's round-off flat groups, this file
  copied in with `PATCH` spelled out, `test_record` with TEMPERED_RECORD_HISTORIES=before).

Code between b84b027 and c97ed5a redrew such a group with no marker: its histories fail replay
on this code (TMPRL1100), which takes a marker-less history for the release before's."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter

from contracts.learner import GRPOConfig
from contracts.names import Queue
from contracts.run import TrainingRunInput, TrainingRunResult
from infra.storage import ObjectStore
from tests.fixtures.temporal import time_skipping_server
from tests.workflows.control_plane import ScriptedSuite, ScriptedTrainer, control_plane
from tests.workflows.replaying import replay, replays_on_its_branch_only
from tests.workflows.test_training_run_fails_at_once import patched
from workflows.training_run import FLAT_ROUNDOFF_PATCH as PATCH
from workflows.training_run import TrainingRunWorkflow

HISTORIES = Path(__file__).parent / "histories"
REDRAWN = "training_run_flat_roundoff_redrawn.json"
BEFORE = "training_run_flat_roundoff_sent_before.json"
RUN = TrainingRunInput(
    run_id="flat-roundoff",
    steps=1,
    group_size=2,
    concurrency=2,
    grpo=GRPOConfig(groups_per_step=2, max_staleness=1, redraw_flat_groups=1),
)
WORKFLOW_ID = f"train-{RUN.run_id}"
EXPECTED = {REDRAWN: (True, 3), BEFORE: (False, 2)}
"""File → (whether it marks the patch, the tasks it started)."""


def recorded(name: str) -> WorkflowHistory:
    return WorkflowHistory.from_json(WORKFLOW_ID, json.loads((HISTORIES / name).read_text()))


def task_rewards(history: WorkflowHistory) -> list[list[float]]:
    """The rewards of each AgentTaskWorkflow child that completed, in the order they ended."""
    converter = pydantic_data_converter.payload_converter
    results = [
        e.child_workflow_execution_completed_event_attributes
        for e in history.events
        if e.HasField("child_workflow_execution_completed_event_attributes")
    ]
    tasks = [r for r in results if r.workflow_type.name == "AgentTaskWorkflow"]
    return [converter.from_payloads(r.result.payloads, [dict])[0]["rewards"] for r in tasks]


async def record_run(store: ObjectStore) -> tuple[TrainingRunResult, WorkflowHistory]:
    """`RUN` on every task flat (round-off apart), to its end; its result and history."""
    trainer, suite = ScriptedTrainer(), ScriptedSuite(train=4, flat_every=1)
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, suite, trainer),
    ):
        handle = await env.client.start_workflow(
            TrainingRunWorkflow.run, RUN, id=WORKFLOW_ID, task_queue=Queue.AGENT_TASKS
        )
        result = await asyncio.wait_for(handle.result(), 60)
        history = await handle.fetch_history()
    assert result.steps == 1 and len(trainer.trained()) == 2, (result, trainer.steps)
    return result, history


@pytest.mark.asyncio
async def test_a_group_flat_but_for_round_off_is_redrawn(store: ObjectStore) -> None:
    """The first group to end is redrawn (before b84b027: sent; between it and c97ed5a:
    redrawn, but with no marker) and a third task takes its slot; the history replays."""
    result, history = await record_run(store)
    assert (result.tasks_started, result.redrawn) == (3, 1), result
    rewards = task_rewards(history)
    assert len(rewards) == 3 and all(len(set(r)) == 2 for r in rewards), rewards
    assert patched(history, PATCH)
    await replay(history, TrainingRunWorkflow)


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.asyncio
async def test_the_recorded_histories_replay(name: str) -> None:
    """Each marks the patch or not, started its tasks, and its groups are round-off apart (the
    patch was asked, or would have been on this code)."""
    history = recorded(name)
    marked, tasks = EXPECTED[name]
    rewards = task_rewards(history)
    assert patched(history, PATCH) == marked
    assert len(rewards) == tasks and all(len(set(r)) == 2 for r in rewards), rewards
    await replay(history, TrainingRunWorkflow)


@pytest.mark.parametrize(("name", "taken"), [(REDRAWN, True), (BEFORE, False)])
@pytest.mark.asyncio
async def test_each_history_replays_on_its_branch_only(
    monkeypatch: pytest.MonkeyPatch, name: str, taken: bool
) -> None:
    """`workflow.patched(FLAT_ROUNDOFF_PATCH)` answers without the history, on its `branch_only`
    copy (tests/workflows/replaying.py): the branch the history took replays; the other (False:
    the release before sends the group this code redrew; True: this code redraws the group the
    release before sent) changes the run's commands and fails."""
    await replays_on_its_branch_only(monkeypatch, recorded(name), PATCH, taken, TrainingRunWorkflow)


@pytest.mark.slow  # a recorder: `make test` leaves it out
@pytest.mark.skipif(not os.environ.get("TEMPERED_RECORD_HISTORIES"), reason="records the history")
@pytest.mark.asyncio
async def test_record(store: ObjectStore) -> None:
    """`REDRAWN` (or, with TEMPERED_RECORD_HISTORIES=before on the release before, `BEFORE`)."""
    _, history = await record_run(store)
    name = BEFORE if os.environ["TEMPERED_RECORD_HISTORIES"] == "before" else REDRAWN
    (HISTORIES / name).write_text(history.to_json())
