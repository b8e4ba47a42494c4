"""Replay a recorded history on this code: `await replay(history, AgentTaskWorkflow)` raises on a
nondeterministic change; `await replay_failure(history, ...)` returns the failure, for a test that
replays on code with one branch of a `workflow.patched` gone (`patch_answers`) and must see it
fail. Its own module, importing only the SDK: test_replay.py defines workflows, and the workflow
sandbox re-imports that module (and what it imports) to run them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from temporalio import workflow
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

if TYPE_CHECKING:
    import pytest


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
    patch's (False). Other patches are asked as ever."""
    real = workflow.patched
    monkeypatch.setattr(
        workflow, "patched", lambda asked: answer if asked == patch else real(asked)
    )
