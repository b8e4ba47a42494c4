"""Workspace episodes through AgentTaskWorkflow on the real dev server and real S3, with a
scripted model and scripted sandbox workers (tests/workflows/harness.py): tool calls, malformed
calls, submit, the step and context budgets, a lost sandbox worker (its sessions restored from
their snapshots, each step recorded once), cancellation closing sessions, and the history of a
50-step group of 8 against Temporal's limits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import WorkflowFailureError, WorkflowHistory
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType

from activities.rewards import RewardActivities
from contracts.episode import EnvStepRequest, EnvStepResponse, ToolCall
from contracts.errors import ErrorType
from contracts.names import Activity, Queue, SearchAttr
from contracts.rollout import AgentTaskResult, TaskStatus
from contracts.task import AgentTaskInput, EnvName, SamplingParams, TaskSpec, WorkspaceSpec
from contracts.trajectory import Trajectory
from infra import keys
from infra.storage import ObjectStore
from tests.workflows.harness import (
    ScriptedModel,
    ScriptedSandbox,
    connect,
    running_workers,
    start,
    tree_digest,
)
from tests.workflows.replaying import replay
from workflows.agent_task import AgentTaskWorkflow
from workflows.search import KEYS
from workflows.sessions import MAX_RESTORES, session_lost

HISTORY = Path(__file__).parent / "histories" / "agent_task_workspace.json"
HISTORY_EVENTS_LIMIT, HISTORY_BYTES_LIMIT = 51_200, 50 * 2**20


def write(path: str, content: str) -> ToolCall:
    return ToolCall(name="write_file", arguments={"path": path, "content": content})


SUBMIT = ToolCall(name="submit")


def workspace_task(store: ObjectStore, task_id: str = "fix") -> TaskSpec:
    files = store.put_json(
        f"scripted-snapshots/{tree_digest({'fixed.py': 'no'})}.json", {"fixed.py": "no"}
    )
    return TaskSpec(
        id=task_id,
        prompt="Make fixed.py read ok, then submit.",
        env=EnvName.WORKSPACE,
        workspace=WorkspaceSpec(files=files, verifier=store.put_text("scripted-tests", "t")),
    )


def task_input(store: ObjectStore, run_id: str, **fields: object) -> AgentTaskInput:
    values: dict[str, object] = {
        "task": workspace_task(store),
        "run_id": run_id,
        "group_size": 3,
        "max_turns": 4,
        "sampling": SamplingParams(max_new_tokens=4, stop_after_tool_call=True),
        "session_timeout_s": 2.0,
        "heartbeat_timeout_s": 5.0,
    }
    values.update(fields)
    return AgentTaskInput.model_validate(values)


def solver(sample: int, step: int) -> str | ToolCall:
    """Sample 0 fixes and submits; sample 1 reads, answers without a call, submits unfixed;
    sample 2 keeps running a command until the step budget ends it."""
    plans: dict[int, list[str | ToolCall]] = {
        0: [write("fixed.py", "ok"), SUBMIT],
        1: [ToolCall(name="read_file", arguments={"path": "fixed.py"}), "I am done.", SUBMIT],
    }
    plan = plans.get(sample, [])
    return plan[step] if step < len(plan) else ToolCall(name="bash", arguments={"command": "ls"})


def workers(model: ScriptedModel, store: ObjectStore) -> dict[Queue | str, dict[str, Any]]:
    return {
        Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]},
        Queue.INFERENCE: {"activities": [model.generate]},
        Queue.REWARDS: {"activities": [RewardActivities(store).write_trajectories]},
    }


@pytest.mark.asyncio
async def test_workspace_group_acts_with_tools_to_done(
    temporal_server, namespace, store: ObjectStore
) -> None:
    client = await connect(temporal_server.address, namespace)
    sandbox = ScriptedSandbox(store, "a")
    model = ScriptedModel(store, solver)
    run_id = f"ws-{uuid.uuid4().hex[:6]}"
    async with running_workers(client, {**workers(model, store), **sandbox.workers()}):
        handle = await start(client, task_input(store, run_id))
        result: AgentTaskResult = await handle.result()
        status: TaskStatus = await handle.query(AgentTaskWorkflow.status)
        described = await handle.describe()

    assert result.state == "DONE" and result.solved == [True, False, False]
    assert result.rewards == [1.0, 0.0, 0.0]  # the verdict's score through RewardConfig.score
    assert result.ends == ["submitted", "submitted", "step_budget"] and result.steps == [2, 3, 4]
    first, second, third = status.samples
    assert [s.call.name for s in first.steps if s.call] == ["write_file", "submit"]
    malformed = second.steps[1].call
    assert malformed is not None and malformed.error and "no tool call" in malformed.error
    assert all(s.observation is not None for e in status.samples for s in e.steps)
    assert third.verdict is not None and third.verdict.score == 0.0
    assert first.steps[-1].reward == 1.0  # the last step carries the episode's reward
    # what the model saw at step 2 of sample 1: the error observation of its malformed call
    observation = second.steps[1].observation
    assert observation and store.get_text(observation.key).startswith("error: no tool call")
    attributes = described.typed_search_attributes
    assert attributes.get(KEYS[SearchAttr.TOOL_CALLS]) == 9
    assert attributes.get(KEYS[SearchAttr.STATE]) == "DONE"
    assert attributes.get(KEYS[SearchAttr.TURN]) == 3
    assert sorted(sandbox.closed) == sorted(
        e.session.session_id for e in status.samples if e.session
    )

    stored = [store.get_model(ref.key, Trajectory) for ref in result.trajectories]
    assert [t.end for t in stored] == ["submitted", "submitted", "step_budget"]
    assert stored[0].steps[0].call == write("fixed.py", "ok") and stored[0].verifier
    assert stored[2].token_ids[:3] == [1, 2, 3] and sum(stored[2].loss_mask) == 8
    history = await handle.fetch_history()
    if os.environ.get("TEMPERED_RECORD_HISTORIES"):
        HISTORY.write_text(history.to_json())


@pytest.mark.asyncio
async def test_recorded_workspace_history_replays() -> None:
    """A change that breaks determinism of workspace episodes fails here."""
    history = WorkflowHistory.from_json("recorded", json.loads(HISTORY.read_text()))
    await replay(history, AgentTaskWorkflow)


@pytest.mark.asyncio
async def test_the_context_budget_ends_episodes_and_is_recorded(
    temporal_server, namespace, store: ObjectStore
) -> None:
    client = await connect(temporal_server.address, namespace)
    sandbox = ScriptedSandbox(store, "a")
    bash = ToolCall(name="bash", arguments={"command": "ls"})
    model = ScriptedModel(store, lambda sample, step: SUBMIT if sample == 0 and step == 1 else bash)
    run_id = f"budget-{uuid.uuid4().hex[:6]}"
    # prompts grow 3 → 7 → 11 tokens; with 55 new tokens a context of 65 fits two steps only
    sampling = SamplingParams(max_new_tokens=55, stop_after_tool_call=True)
    task = task_input(
        store, run_id, group_size=2, max_turns=10, max_context_tokens=65, sampling=sampling
    )
    async with running_workers(client, {**workers(model, store), **sandbox.workers()}):
        result: AgentTaskResult = await (await start(client, task)).result()
    assert result.ends == ["submitted", "context_budget"] and result.steps == [2, 2]
    assert [len(call.items) for call in model.calls] == [2, 2, 1]  # step 2: sample 1 only
    ended = Trajectory.model_validate_json(store.get_bytes(result.trajectories[1].key))
    assert ended.end == "context_budget" and len(ended.token_ids) == 9  # 7 prompt + 2 sampled
    assert ended.steps[-1].step == 1  # nothing was cut: the episode stopped before step 2


@pytest.mark.parametrize("loss", ["worker killed", "sessions reaped"])
@pytest.mark.asyncio
async def test_a_lost_sandbox_worker_is_survived_from_the_snapshots(
    temporal_server, namespace, store: ObjectStore, loss: str
) -> None:
    """Sessions lost at step 2 (their worker gone, or the sessions gone from a live worker):
    restored from the last snapshots, the episode ends with the workspace it would have had,
    and every step is recorded once."""

    def edits(sample: int, step: int) -> ToolCall:
        if step == 4:
            return SUBMIT
        return write(f"f{step}.txt", f"sample {sample} step {step}")

    client = await connect(temporal_server.address, namespace)
    run_id = f"lost-{uuid.uuid4().hex[:6]}"
    first = ScriptedSandbox(store, "a")
    reached, release = asyncio.Event(), asyncio.Event()

    async def gate(step: int) -> None:
        if step == 2:
            reached.set()
            await release.wait()

    plain = ScriptedModel(store, edits)
    gated = ScriptedModel(store, edits, gate=gate)
    task = task_input(store, run_id, group_size=2, max_turns=6)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(
            running_workers(client, {**workers(plain, store), **first.workers()})
        )
        expected: AgentTaskResult = await (await start(client, task, "-plain")).result()
        plain_status = await (client.get_workflow_handle(f"{run_id}-fix-plain")).query(
            AgentTaskWorkflow.status
        )
    digests = [e.session.tree_digest for e in plain_status.samples if e.session]

    first = ScriptedSandbox(store, "a")
    second = ScriptedSandbox(store, "b")
    async with running_workers(client, workers(gated, store)):
        stack = contextlib.AsyncExitStack()
        await stack.enter_async_context(running_workers(client, first.workers()))
        handle = await start(client, task)
        await asyncio.wait_for(reached.wait(), 60)
        if loss == "worker killed":
            await stack.aclose()  # its queue is never polled again
            await stack.enter_async_context(running_workers(client, second.workers()))
        else:
            first.sessions.clear()  # e.g. reaped by its TTL: the worker answers SessionLost
        started = time.monotonic()
        release.set()
        result: AgentTaskResult = await handle.result()
        status: TaskStatus = await handle.query(AgentTaskWorkflow.status)
        await stack.aclose()

    assert result.rewards == expected.rewards and result.steps == expected.steps == [5, 5]
    assert [e.session.tree_digest for e in status.samples if e.session] == digests
    for episode in status.samples:
        assert [s.step for s in episode.steps] == [0, 1, 2, 3, 4]  # the lost step once
    restored_on = second if loss == "worker killed" else first
    assert (0, 2) in restored_on.steps_run and (1, 4) in restored_on.steps_run
    assert all(e.session and e.session.queue == restored_on.queue for e in status.samples)
    print(f"\n[{loss}] restored and finished {time.monotonic() - started:.1f}s after the loss")


class WorkerKillingStep(ScriptedSandbox):
    """A sandbox worker whose sessions are gone whenever step 1 runs (as if the step's command
    took the worker down, and the worker came back empty)."""

    @activity.defn(name=Activity.ENV_STEP.value)
    async def env_step(self, req: EnvStepRequest) -> EnvStepResponse:
        if req.step == 1:
            self.sessions.clear()
        return await super().env_step(req)


@pytest.mark.asyncio
async def test_a_step_that_loses_its_sessions_each_time_fails_the_task(
    temporal_server, namespace, store: ObjectStore
) -> None:
    """Restored from the snapshots and lost again, for ever (the history growing): now the
    task fails after MAX_RESTORES restores, naming the step."""
    client = await connect(temporal_server.address, namespace)
    sandbox = WorkerKillingStep(store, "a")
    model = ScriptedModel(store, lambda sample, step: write(f"f{step}.txt", "x"))
    task = task_input(store, f"killer-{uuid.uuid4().hex[:6]}", group_size=1, max_turns=4)
    async with running_workers(client, {**workers(model, store), **sandbox.workers()}):
        handle = await start(client, task)
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), 60)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ErrorType.SESSION_LOST
    assert f"lost {MAX_RESTORES + 1} times at step 1" in str(cause)
    assert sandbox.opened == 1 + MAX_RESTORES


@pytest.mark.asyncio
async def test_cancelling_a_task_closes_its_sessions(
    temporal_server, namespace, store: ObjectStore
) -> None:
    client = await connect(temporal_server.address, namespace)
    sandbox = ScriptedSandbox(store, "a")
    reached = asyncio.Event()

    async def gate(step: int) -> None:
        if step == 1:
            reached.set()
            await asyncio.Event().wait()  # never answers: the task is cancelled meanwhile

    model = ScriptedModel(store, solver, gate=gate)
    task = task_input(store, f"cancel-{uuid.uuid4().hex[:6]}")
    async with running_workers(client, {**workers(model, store), **sandbox.workers()}):
        handle = await start(client, task)
        await asyncio.wait_for(reached.wait(), 60)
        opened = set(sandbox.sessions)
        assert len(opened) == 3
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    assert set(sandbox.closed) == opened and not sandbox.sessions


@pytest.mark.asyncio
async def test_a_fifty_step_group_of_eight_stays_far_below_the_history_limits(
    temporal_server, namespace, store: ObjectStore
) -> None:
    client = await connect(temporal_server.address, namespace)
    sandbox = ScriptedSandbox(store, "a")
    content = "x = 1\n" * 60  # a 360-byte file written at every step: calls are not tiny
    model = ScriptedModel(store, lambda sample, step: write(f"f{step}.py", content))
    task = task_input(
        store,
        f"long-{uuid.uuid4().hex[:6]}",
        group_size=8,
        max_turns=50,
        max_context_tokens=1 << 16,
    )
    started = time.monotonic()
    async with running_workers(client, {**workers(model, store), **sandbox.workers()}):
        handle = await start(client, task)
        result: AgentTaskResult = await handle.result()
    elapsed = time.monotonic() - started
    history = await handle.fetch_history()
    events = len(history.events)
    size = sum(event.ByteSize() for event in history.events)
    print(
        f"\n50 steps × G=8: {events} events, {size / 2**20:.2f} MiB of history "
        f"({events / HISTORY_EVENTS_LIMIT:.1%} and {size / HISTORY_BYTES_LIMIT:.1%} of the "
        f"limits), {elapsed:.1f}s"
    )
    assert result.steps == [50] * 8 and result.ends == ["step_budget"] * 8
    assert events < HISTORY_EVENTS_LIMIT / 20 and size < HISTORY_BYTES_LIMIT / 10
    assert len(list(store.list_keys(keys.trajectories_prefix(task.run_id)))) == 8


def test_only_a_gone_worker_or_a_lost_session_restores_the_sessions() -> None:
    """`session_lost` decides whether a failed step is run again from the snapshots (the
    holding worker is gone: schedule-to-start timeout; or lost the session) or fails the task."""

    def failed_step(cause: BaseException) -> ActivityError:
        error = ActivityError(
            "step failed",
            scheduled_event_id=5,
            started_event_id=6,
            identity="worker",
            activity_type="env_step",
            activity_id="7",
            retry_state=None,
        )
        error.__cause__ = cause
        return error

    def timeout(kind: TimeoutType) -> TimeoutError:
        return TimeoutError("timed out", type=kind, last_heartbeat_details=[])

    assert session_lost(failed_step(timeout(TimeoutType.SCHEDULE_TO_START)))
    assert session_lost(failed_step(ApplicationError("gone", type=ErrorType.SESSION_LOST)))
    assert not session_lost(failed_step(timeout(TimeoutType.START_TO_CLOSE)))
    assert not session_lost(failed_step(ApplicationError("bad", type=ErrorType.INVALID_TASK)))
    assert not session_lost(failed_step(ApplicationError("untyped")))
