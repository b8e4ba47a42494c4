"""The recorded run whose groups go in step order (`ORDERED_GROUPS_PATCH`) while it redraws flat
groups and drains to continue as new: `training_run_ordered_redraws.json` and `…_1.json`, its
two segments, which test_replay.py replays (`training_run_ordered.json` has neither: one
segment, no flat group).

Recorded by test_training_run_order.py's `test_no_group_is_dropped_as_stale[5]` with
`TEMPERED_RECORD_HISTORIES=1` (12 steps of 4 groups, a
third of the tasks flat, 5 redrawn, on a 400-event budget). The other tests prove the recorded
histories hold what they are kept for: the patch's marker in each segment, a drain that sends a
held group once the group of the earlier step it waited for has come, and flat groups redrawn
in their step's place (a replay where a redrawn group's place stays taken fails)."""

from __future__ import annotations

import json

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner

from contracts.learner import GRPOConfig, HistoryBudget, TrajectoryGroup
from contracts.names import Signal
from contracts.run import TrainingRunInput
from tests.workflows.test_replay import HISTORIES, RECORDED
from tests.workflows.test_training_run_order import ORDERED_SEGMENTS
from workflows.step_slots import StepSlots
from workflows.training_run import ORDERED_GROUPS_PATCH, TrainingRunWorkflow

SEGMENTS = ORDERED_SEGMENTS
RUN = TrainingRunInput(  # test_training_run_order.py's, with 5 redraws
    run_id="order-5",
    steps=12,
    group_size=2,
    concurrency=8,
    grpo=GRPOConfig(groups_per_step=4, max_staleness=1, redraw_flat_groups=5),
    budget=HistoryBudget(events=400),
)


def segment(name: str) -> WorkflowHistory:
    return WorkflowHistory.from_json(RECORDED[name][1], json.loads((HISTORIES / name).read_text()))


def after_last_start(history: WorkflowHistory) -> list[list[str]]:
    """The task ids of each `add_groups` signal sent after the segment started its last task."""
    events = list(history.events)
    last = max(
        index
        for index, event in enumerate(events)
        if event.HasField("start_child_workflow_execution_initiated_event_attributes")
    )
    sent = []
    for event in events[last:]:
        signal = event.signal_external_workflow_execution_initiated_event_attributes
        if signal.signal_name == Signal.ADD_GROUPS:
            payloads = signal.input.payloads
            converter = pydantic_data_converter.payload_converter
            groups = converter.from_payloads(payloads, [list[TrajectoryGroup]])[0]
            sent.append([group.task_id for group in groups])
    return sent


def test_each_segment_took_the_ordered_branch() -> None:
    assert set(SEGMENTS) <= set(RECORDED)
    for name in SEGMENTS:
        events = segment(name).events
        markers = [e for e in events if e.HasField("marker_recorded_event_attributes")]
        assert any(ORDERED_GROUPS_PATCH.encode() in e.SerializeToString() for e in markers), name


def test_the_first_segment_drained_a_held_group_before_it_continued_as_new() -> None:
    """As its last tasks ended, a group held for its step went out with the earlier step's group
    it had waited for, in one signal."""
    first = segment(SEGMENTS[0])
    assert first.events[-1].HasField("workflow_execution_continued_as_new_event_attributes")
    drained = after_last_start(first)
    assert any(len(ids) > 1 for ids in drained), drained


@pytest.mark.asyncio
async def test_a_replay_where_a_redrawn_groups_place_stays_taken_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both segments took the ordered branch's redraw path (`StepSlots.redrawn`)."""
    monkeypatch.setattr(StepSlots, "redrawn", lambda self, step: None)
    replayer = Replayer(
        workflows=[TrainingRunWorkflow],
        data_converter=pydantic_data_converter,
        workflow_runner=UnsandboxedWorkflowRunner(),  # runs the patched StepSlots
    )
    for name in SEGMENTS:
        result = await replayer.replay_workflow(segment(name), raise_on_replay_failure=False)
        assert "Nondeterminism" in str(result.replay_failure), name
