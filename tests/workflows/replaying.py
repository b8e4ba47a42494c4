"""Replay a recorded history on this code: `await replay(history, AgentTaskWorkflow)` raises on a
nondeterministic change. Its own module, importing only the SDK: test_replay.py defines
workflows, and the workflow sandbox re-imports that module (and what it imports) to run them."""

from __future__ import annotations

from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer


async def replay(history: WorkflowHistory, *workflows: type) -> None:
    replayer = Replayer(workflows=list(workflows), data_converter=pydantic_data_converter)
    await replayer.replay_workflow(history)
