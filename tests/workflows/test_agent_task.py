"""AgentTaskWorkflow on the real dev server, with real S3, real bwrap sandbox, real trajectory
writer; only the model is scripted (so rewards are known in advance). Also: the circuit breaker
(`abort_after`), the abort signal, and a turn with every episode over the context budget."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHistory

from activities.rewards import RewardActivities
from activities.sandbox import SandboxActivities
from contracts.names import Queue, SearchAttr
from contracts.rollout import AgentTaskResult, TaskStatus
from contracts.task import AgentTaskInput, SamplingParams, SandboxLimits, TaskSpec
from contracts.trajectory import Trajectory
from infra import keys
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.workflows.harness import ScriptedModel, connect, running_workers, start
from tests.workflows.replaying import replay
from workflows.agent_task import AgentTaskWorkflow
from workflows.search import task_start_options

HISTORY = Path(__file__).parent / "histories" / "agent_task.json"
TASK = TaskSpec(
    id="add-two",
    prompt="Write add(a, b) returning a + b.",
    entry_point="add",
    tests="def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n",
)
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"


def script(sample: int, turn: int) -> str:
    """Sample 0 solves at once, sample 1 on its second turn, sample 2 never."""
    return {0: RIGHT, 1: RIGHT if turn >= 1 else WRONG}.get(sample, WRONG)


def settings_for(store: ObjectStore, address: str, namespace: str, tmp_path: Path) -> Settings:
    return Settings(
        home=tmp_path,
        temporal={"address": address, "namespace": namespace},
        s3=store.settings.model_copy(update={"bucket": store.bucket}),
    )


def task_workers(
    settings: Settings, store: ObjectStore, model: ScriptedModel
) -> dict[Queue | str, dict[str, Sequence[Any]]]:
    """The agent task's workers: the real sandbox and trajectory writer, a scripted model."""
    return {
        Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]},
        Queue.INFERENCE: {"activities": [model.generate]},
        Queue.SANDBOX: {"activities": [SandboxActivities(settings, store).execute]},
        Queue.REWARDS: {"activities": [RewardActivities(store).write_trajectories]},
    }


def task_input_of(prefix: str, **fields: Any) -> AgentTaskInput:
    """`TASK` in a run of its own (`<prefix>-<random>`)."""
    return AgentTaskInput(task=TASK, run_id=f"{prefix}-{uuid.uuid4().hex[:6]}", **fields)


@pytest.mark.asyncio
async def test_group_rolls_out_to_done_with_known_rewards(
    temporal_server, namespace, store: ObjectStore, tmp_path: Path
) -> None:
    settings = settings_for(store, temporal_server.address, namespace, tmp_path)
    client = await connect(temporal_server.address, namespace)
    model = ScriptedModel(store, script)
    task_input = task_input_of("wf", group_size=3, max_turns=3)
    run_id = task_input.run_id
    async with running_workers(client, task_workers(settings, store, model)):
        handle = await start(client, task_input)
        result: AgentTaskResult = await handle.result()
        status: TaskStatus = await handle.query(AgentTaskWorkflow.status)

    assert result.state == "DONE" and status.state == "DONE"
    assert result.solved == [True, True, False]
    assert result.rewards == pytest.approx([1.0, 0.9, -0.30000000000000004])
    # turn 0: all three generate; turn 1: samples 1 and 2; turn 2: sample 2 only
    assert [[i.sample for i in c.items] for c in model.calls] == [[0, 1, 2], [1, 2], [2]]
    assert [len(s.steps) for s in status.samples] == [1, 2, 3]
    assert [s.end for s in status.samples] == ["submitted", "submitted", "step_budget"]
    assert result.steps == [1, 2, 3] and result.ends == ["submitted", "submitted", "step_budget"]
    # step 1 gets step 0's completion and its result (the test log) by reference
    first_step = status.samples[1].steps[0]
    assert first_step.status == "failed" and first_step.observation is not None
    item = model.calls[1].items[0]
    assert (item.previous, item.observation) == (first_step.completion, first_step.observation)

    stored = sorted(store.list_keys(keys.trajectories_prefix(run_id)))
    assert stored == [keys.trajectory_key(run_id, TASK.id, s) for s in range(3)]
    second = store.get_model(stored[1], Trajectory)
    assert [t.status for t in second.steps] == ["failed", "passed"]
    assert second.reward == pytest.approx(0.9) and second.end == "submitted"
    assert second.token_ids == [1, 2, 3, 4, 5, 6, 7, 4, 5]  # the scripted model's ids
    assert second.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 1]

    history = await handle.fetch_history()
    activity_types = {
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    assert activity_types == {"generate", "execute", "write_trajectories"}
    # one upsert per visible move (a step's FEEDBACK figures ride on the next one; the last
    # FEEDBACK is upserted while the trajectories are written), memo upserted once
    assert upserted_states(history) == ["GENERATE", "EXECUTE"] * 3 + ["FEEDBACK", "DONE"]
    assert memo_upserts(history) == 1
    listed = [
        w.id
        async for w in client.list_workflows(
            f'TemperedRunId = "{run_id}" AND TemperedState = "DONE" AND TemperedReward >= 1.0'
        )
    ]
    assert listed == [handle.id] or listed == []  # visibility is eventually consistent
    if os.environ.get("TEMPERED_RECORD_HISTORIES"):
        HISTORY.parent.mkdir(exist_ok=True)
        HISTORY.write_text(history.to_json())


def upserted_states(history: WorkflowHistory) -> list[str]:
    """The TemperedState values the workflow upserted, in order."""
    upserts = [
        e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
        for e in history.events
        if e.HasField("upsert_workflow_search_attributes_event_attributes")
    ]
    key = SearchAttr.STATE.value
    return [json.loads(fields[key].data) for fields in upserts if key in fields]


def memo_upserts(history: WorkflowHistory) -> int:
    return sum(e.HasField("workflow_properties_modified_event_attributes") for e in history.events)


@pytest.mark.asyncio
async def test_a_task_started_with_its_memo_writes_no_memo(
    temporal_server, namespace, store: ObjectStore, tmp_path: Path
) -> None:
    """As the training run starts its tasks (`task_start_options`): the memo and the run's and
    task's attributes ride on the start event, so the workflow writes neither."""
    settings = settings_for(store, temporal_server.address, namespace, tmp_path)
    client = await connect(temporal_server.address, namespace)
    task_input = task_input_of("memo", max_turns=1)
    model = ScriptedModel(store, script)
    async with running_workers(client, task_workers(settings, store, model)):
        handle = await start(client, task_input, **task_start_options(task_input))
        await handle.result()
    history = await handle.fetch_history()
    assert memo_upserts(history) == 0
    assert upserted_states(history) == ["GENERATE", "EXECUTE", "FEEDBACK", "DONE"]
    assert (await (await handle.describe()).memo())["task"] == TASK.id
    await replay(history, AgentTaskWorkflow)  # the patched path replays on its own history


@pytest.mark.asyncio
async def test_a_turn_with_every_episode_over_the_context_budget_executes_nothing(
    temporal_server, namespace, store: ObjectStore, tmp_path: Path
) -> None:
    """Prompts grow 3 → 7 tokens; with 59 new tokens a context of 64 fits the first turn only:
    at the second, GENERATE samples no episode, and the group ends without an empty EXECUTE."""
    settings = settings_for(store, temporal_server.address, namespace, tmp_path)
    client = await connect(temporal_server.address, namespace)
    task_input = task_input_of(
        "full",
        group_size=2,
        max_turns=3,
        max_context_tokens=64,
        sampling=SamplingParams(max_new_tokens=59),
    )
    model = ScriptedModel(store, lambda sample, turn: WRONG)
    async with running_workers(client, task_workers(settings, store, model)):
        handle = await start(client, task_input)
        result: AgentTaskResult = await handle.result()
    assert result.ends == ["context_budget"] * 2 and result.steps == [1, 1]
    assert len(model.calls) == 2
    history = await handle.fetch_history()
    executed = [
        e
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "execute"
    ]
    assert len(executed) == 1


LOOPS = "def add(a, b):\n    while True:\n        pass\n"


@pytest.mark.parametrize(("abort_after", "turns", "failures"), [(2, 1, 2), (3, 2, 4)])
@pytest.mark.asyncio
async def test_the_circuit_breaker_aborts_at_its_threshold_of_runs_over_their_limits(
    temporal_server,
    namespace,
    store: ObjectStore,
    tmp_path: Path,
    abort_after: int,
    turns: int,
    failures: int,
) -> None:
    """Sample 0 solves at once; samples 1 and 2 loop until the sandbox's time limit, twice a
    turn: with `abort_after` 2 the first turn's two reach it, with 3 the second turn's four."""
    settings = settings_for(store, temporal_server.address, namespace, tmp_path)
    client = await connect(temporal_server.address, namespace)
    task_input = task_input_of(
        "breaker",
        group_size=3,
        max_turns=4,
        limits=SandboxLimits(timeout_s=1.0),
        abort_after=abort_after,
    )
    model = ScriptedModel(store, lambda sample, turn: RIGHT if sample == 0 else LOOPS)
    async with running_workers(client, task_workers(settings, store, model)):
        result = await (await start(client, task_input)).result()
    assert len(model.calls) == turns and result.ends == ["submitted", "aborted", "aborted"]
    assert result.aborted_reason == (
        f"circuit breaker: {failures} runs hit timeout or memory_exceeded (threshold {abort_after})"
    )


@pytest.mark.asyncio
async def test_an_abort_signal_ends_the_task_after_its_current_step(
    temporal_server, namespace, store: ObjectStore, tmp_path: Path
) -> None:
    settings = settings_for(store, temporal_server.address, namespace, tmp_path)
    client = await connect(temporal_server.address, namespace)
    reached, release = asyncio.Event(), asyncio.Event()

    async def gate(turn: int) -> None:
        if turn == 1:
            reached.set()
            await release.wait()

    task_input = task_input_of("abort", max_turns=5)
    model = ScriptedModel(store, lambda sample, turn: WRONG, gate=gate)
    async with running_workers(client, task_workers(settings, store, model)):
        handle = await start(client, task_input)
        await asyncio.wait_for(reached.wait(), 60)
        await handle.signal(AgentTaskWorkflow.abort, "an operator stopped it")
        await handle.signal(AgentTaskWorkflow.abort, "a second reason is not kept")
        release.set()
        result = await handle.result()
    assert result.aborted_reason == "an operator stopped it" and result.state == "DONE"
    assert result.steps == [2] * task_input.group_size  # the step in flight was finished
    assert result.ends == ["aborted"] * task_input.group_size and len(model.calls) == 2


@pytest.mark.asyncio
async def test_invalid_task_fails_once_naming_the_field(temporal_server, namespace) -> None:
    client = await connect(temporal_server.address, namespace)
    bad = {
        "task": {"id": "x", "prompt": "p", "entry_point": "1bad", "tests": "pass"},
        "group_size": 0,
    }
    async with running_workers(client, {Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]}}):
        with pytest.raises(WorkflowFailureError) as caught:
            await client.execute_workflow(
                "AgentTaskWorkflow",
                bad,
                id=f"bad-{uuid.uuid4().hex[:6]}",
                task_queue=Queue.AGENT_TASKS.value,
            )
    message = str(caught.value.cause)
    assert "task.entry_point" in message and "group_size" in message
    assert getattr(caught.value.cause, "non_retryable", False)


@pytest.mark.asyncio
async def test_recorded_history_replays() -> None:
    """A change that breaks determinism of AgentTaskWorkflow fails here."""
    history = WorkflowHistory.from_json("recorded", json.loads(HISTORY.read_text()))
    await replay(history, AgentTaskWorkflow)
