"""A workspace group whose calls carry large arguments (64 KB files written at every step)
through AgentTaskWorkflow on the real dev server and real S3, with the scripted model and
sandbox of tests/workflows/harness.py: the task completes, no payload of its history carries
the arguments (each call travels as its brief, `ToolCall.brief`), and the stored trajectories
hold the whole calls, parsed again from each turn's CompletionRecord.

Before, every call travelled whole: `write_trajectories`' request held all of them (2.25 MiB
here), the SDK refused it (TMPRL1103, payloads too large) and retried the workflow task for
ever, so the task hung at DONE."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle, WorkflowQueryFailedError

from contracts.episode import ToolCall
from contracts.rollout import AgentTaskResult, TaskStatus
from contracts.trajectory import Trajectory
from infra.storage import ObjectStore
from tests.workflows.harness import ScriptedModel, ScriptedSandbox, connect, running_workers, start
from tests.workflows.test_episodes import SUBMIT, task_input, workers, write
from workflows.agent_task import AgentTaskWorkflow

GROUP, STEPS, FILE_CHARS = 4, 9, 64 * 1024
"""4 × 9 calls of 64 KB: 2.25 MiB of arguments, over the SDK's 2 MiB bound on a payload."""
HUGE_NAME = "n" * 5000
"""An unknown tool's name, which its error call's message repeats: cut in payloads too."""


def content(sample: int, step: int) -> str:
    line = f"# sample {sample} step {step}: a line of a realistic source file\n"
    return (line * (FILE_CHARS // len(line) + 1))[:FILE_CHARS]


def big_writes(sample: int, step: int) -> str | ToolCall:
    """Every sample writes a 64 KB file at every step; sample 3 calls an unknown tool of a
    5,000-character name at step 1 (an error call) and submits at the last step."""
    if sample == 3 and step == 1:
        return f'<tool_call>{{"name": "{HUGE_NAME}", "arguments": {{}}}}</tool_call>'
    if sample == 3 and step == STEPS - 1:
        return SUBMIT
    return write(f"f{step % 3}.py", content(sample, step))


@pytest.mark.asyncio
async def test_large_call_arguments_stay_out_of_the_payloads(
    temporal_server, namespace, store: ObjectStore
) -> None:
    client = await connect(temporal_server.address, namespace)
    sandbox = ScriptedSandbox(store, "a")
    model = ScriptedModel(store, big_writes)
    task = task_input(
        store,
        f"big-{uuid.uuid4().hex[:6]}",
        group_size=GROUP,
        max_turns=STEPS,
        max_context_tokens=1 << 16,
    )
    async with running_workers(client, {**workers(model, store), **sandbox.workers()}):
        handle = await start(client, task)
        try:
            result: AgentTaskResult = await asyncio.wait_for(handle.result(), 90)
        except TimeoutError:
            history = await handle.fetch_history()
            failures = [
                e.workflow_task_failed_event_attributes.failure.message
                for e in history.events
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
            ]
            await handle.terminate("the test gave up on it")
            pytest.fail(
                f"the task did not finish in 90 s; its workflow task failed: {failures[-1:]}"
            )
        status = await query_status(handle)
        history = await handle.fetch_history()

    assert result.steps == [STEPS] * GROUP
    assert result.ends == ["step_budget"] * 3 + ["submitted"]
    largest = max(event.ByteSize() for event in history.events)
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    (trajectories,) = [a for a in scheduled if a.activity_type.name == "write_trajectories"]
    request_bytes = sum(len(p.data) for p in trajectories.input.payloads)
    print(
        f"\nlargest event {largest / 1024:.1f} KiB, write_trajectories {request_bytes / 1024:.1f} KiB"
    )
    assert largest < 64 * 1024 and request_bytes < 48 * 1024

    # the workflow's calls are the brief ones; the sandbox ran the full ones
    first = status.samples[0].steps[0].call
    assert first is not None and first.cut and first.name == "write_file"
    assert len(first.arguments["content"]) < 1024
    session = status.samples[0].session
    assert session is not None
    tree = json.loads(store.get_verified(session.snapshot))
    assert tree[f"f{(STEPS - 1) % 3}.py"] == content(0, STEPS - 1)

    stored = [store.get_model(ref.key, Trajectory) for ref in result.trajectories]
    for trajectory in stored:
        for step in trajectory.steps:
            expected = big_writes(trajectory.sample, step.step)
            if isinstance(expected, ToolCall):
                assert step.call == expected  # the full call: every character, not cut
    error = stored[3].steps[1].call
    assert error is not None and error.error and HUGE_NAME in error.error and not error.cut
    observation = store.get_text(status.samples[3].steps[1].observation.key)
    assert observation == f"error: {error.error}"  # the sandbox saw the whole error


async def query_status(handle: WorkflowHandle[Any, Any]) -> TaskStatus:
    """The task's `status` query, asked again where the SDK's deadlock detector failed it (a
    loaded host took past 2 s to read the history's large results: TMPRL1101)."""
    for _ in range(4):
        try:
            status: TaskStatus = await handle.query(AgentTaskWorkflow.status)
            return status
        except WorkflowQueryFailedError as err:
            if "TMPRL1101" not in str(err):
                raise
            await asyncio.sleep(1)
    return await handle.query(AgentTaskWorkflow.status)
