"""Replay a recorded history on this code: `await replay(history, AgentTaskWorkflow)` raises on a
nondeterministic change; `await replay_failure(history, ...)` returns the failure.

A patch's two branches are each held by their own history: `await replays_on_its_branch_only(
monkeypatch, history, patch, taken, ...)` replays `history` with `workflow.patched(patch)`
answering `taken` (the branch it took: it must replay) and `not taken` (it must fail with
nondeterminism), each on a `branch_only` copy, so the run's commands alone decide. The SDK fails
the replay of a history holding a non-deprecated patch marker that no `workflow.patched` asks
for, and `patch_answers` asks nothing: on the history as recorded, a marked history fails under
either answer, whatever the branches do.

Its own module, importing only the SDK: test_replay.py defines workflows, and the workflow
sandbox re-imports that module (and what it imports) to run them."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from temporalio import workflow
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

if TYPE_CHECKING:
    import pytest

PATCH_MARKER, PATCH_DATA = "core_patch", "patch-data"
"""The SDK core's patch marker: its name, and the details key of its `{"id", "deprecated"}`."""


async def replay(history: WorkflowHistory, *workflows: type) -> None:
    replayer = Replayer(workflows=list(workflows), data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)


async def replay_failure(history: WorkflowHistory, *workflows: type) -> str:
    """The replay's failure, "" when it replays."""
    replayer = Replayer(workflows=list(workflows), data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    return "" if result.replay_failure is None else str(result.replay_failure)


def patch_answers(monkeypatch: pytest.MonkeyPatch, patch: str, answer: bool) -> None:
    """`workflow.patched(patch)` answers `answer` without asking the history (and records no
    marker): the code keeps one branch only, the new one (True) or the release before the
    patch's (False). Other patches are asked as ever. Replay a marked history so only on its
    `branch_only` copy."""
    real = workflow.patched
    monkeypatch.setattr(
        workflow, "patched", lambda asked: answer if asked == patch else real(asked)
    )


def branch_only(history: WorkflowHistory, patch: str) -> WorkflowHistory:
    """A copy of `history` with `patch`'s marker (if it holds one) deprecated: the SDK skips a
    deprecated marker that no `workflow.patched` asks for, so a replay under `patch_answers`
    fails on the run's commands only. Other markers are left as they are."""
    events = []
    for event in history.events:
        copy = HistoryEvent()
        copy.CopyFrom(event)
        marker = copy.marker_recorded_event_attributes
        if copy.HasField("marker_recorded_event_attributes") and marker.marker_name == PATCH_MARKER:
            for payload in marker.details[PATCH_DATA].payloads:
                if json.loads(payload.data)["id"] == patch:
                    payload.data = json.dumps({"id": patch, "deprecated": True}).encode()
        events.append(copy)
    return WorkflowHistory(history.workflow_id, events)


async def replays_on_its_branch_only(
    monkeypatch: pytest.MonkeyPatch,
    history: WorkflowHistory,
    patch: str,
    taken: bool,
    *workflows: type,
) -> None:
    """`history` (its `branch_only` copy) replays with `workflow.patched(patch)` answering
    `taken`, and fails with nondeterminism answering `not taken`: each branch changes the
    commands, and `history` holds the one it took."""
    patch_answers(monkeypatch, patch, taken)
    failure = await replay_failure(branch_only(history, patch), *workflows)
    assert failure == "", f"{patch} answered {taken}: {failure}"
    patch_answers(monkeypatch, patch, not taken)
    failure = await replay_failure(branch_only(history, patch), *workflows)
    assert "nondetermin" in failure.lower(), f"{patch} answered {not taken}: {failure!r}"
