"""A task started by hand (`temporal workflow start … --input '<json>'`) whose tests are broken
fails at its start with `InvalidTask` naming the field (`TaskSpec.load_problem`, the check task
files get where they load; workflows/agent_task.py `TESTS_CHECKED_PATCH`): the real dev server,
S3 and bwrap sandbox, a scripted model, the real trajectory writer.

Before, only the schema was checked: hidden tests with no top-level assert made every `execute`
raise a plain ValueError, retried for ever (the task never ended), and tests with an entry point
but no `check(candidate)` failed every program, a correct one too, and the task ended DONE
(training on noise). `agent_task_broken_tests_before.json` is such a task as the release before
the patch ran it (`test_record_before`, with `TEMPERED_RECORD_HISTORIES=1`: no marker, DONE): it
must replay as it ran."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowHistory,
)
from temporalio.exceptions import ApplicationError

import workflows.agent_task as agent_task
from contracts.errors import ErrorType
from contracts.names import Queue
from contracts.rollout import AgentTaskResult
from infra.storage import ObjectStore
from tests.workflows.harness import ScriptedModel, connect, running_workers
from tests.workflows.replaying import patch_answers, replay, replays_on_its_branch_only
from tests.workflows.test_agent_task import RIGHT, settings_for, task_workers
from workflows.agent_task import AgentTaskWorkflow

pytestmark = pytest.mark.asyncio
PATCH = getattr(agent_task, "TESTS_CHECKED_PATCH", "tempered-task-tests-checked")
BEFORE = Path(__file__).parent / "histories" / "agent_task_broken_tests_before.json"
BEFORE_ID = "broken-before-add"
CHECK = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
UNCALLED_HIDDEN = "def check(candidate):\n    assert candidate(1, 1) == 2\n"
PLAIN_ASSERTS = "assert add(2, 3) == 5\n"
WAIT_S = 60  # a broken task fails at once; before, (a) never ended


def hand_started(**task: Any) -> dict[str, Any]:
    """The JSON a person passes to `temporal workflow start --input` (a dict, not a model)."""
    spec = {"id": "add", "prompt": "Write add(a, b).", "entry_point": "add", "tests": CHECK}
    return {"task": spec | task, "run_id": f"broken-{uuid.uuid4().hex[:6]}", "group_size": 2}


async def start_raw(
    client: Client, raw: dict[str, Any], workflow_id: str = ""
) -> WorkflowHandle[Any, AgentTaskResult]:
    return await client.start_workflow(
        "AgentTaskWorkflow",
        raw,
        id=workflow_id or f"{raw['run_id']}-{raw['task']['id']}",
        task_queue=Queue.AGENT_TASKS.value,
        result_type=AgentTaskResult,
    )


def marked(history: WorkflowHistory) -> bool:
    return any(
        PATCH.encode() in e.SerializeToString()
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
    )


def scheduled(history: WorkflowHistory) -> list[str]:
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]


@pytest.mark.parametrize(
    ("task", "field"),
    [
        ({"hidden_tests": UNCALLED_HIDDEN}, "task.hidden_tests: "),  # (a) retried for ever
        ({"tests": PLAIN_ASSERTS}, "task.tests: "),  # (b) every program failed, DONE
    ],
    ids=["hidden-tests-uncalled-check", "entry-point-without-check"],
)
async def test_a_hand_started_task_with_broken_tests_fails_at_once(
    temporal_server,
    namespace,
    store: ObjectStore,
    tmp_path: Path,
    task: dict[str, str],
    field: str,
) -> None:
    settings = settings_for(store, temporal_server.address, namespace, tmp_path)
    client = await connect(temporal_server.address, namespace)
    model = ScriptedModel(store, lambda sample, turn: RIGHT)
    async with running_workers(client, task_workers(settings, store, model)):
        handle = await start_raw(client, hand_started(**task))
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), WAIT_S)
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == ErrorType.INVALID_TASK
    assert cause.non_retryable and cause.message.startswith(f"invalid task: {field}"), cause.message
    history = await handle.fetch_history()
    assert scheduled(history) == [] and model.calls == []  # at its start: nothing ran
    assert marked(history)
    await replay(history, AgentTaskWorkflow)


async def test_a_good_hand_started_task_runs_and_asks_no_patch(
    temporal_server, namespace, store: ObjectStore, tmp_path: Path
) -> None:
    """Hidden top-level asserts and a `check`: it runs to DONE, and records no marker (so every
    recorded good task replays as it ran)."""
    settings = settings_for(store, temporal_server.address, namespace, tmp_path)
    client = await connect(temporal_server.address, namespace)
    model = ScriptedModel(store, lambda sample, turn: RIGHT)
    raw = hand_started(hidden_tests="assert add(40, 2) == 42\n")
    async with running_workers(client, task_workers(settings, store, model)):
        handle = await start_raw(client, raw)
        result = await asyncio.wait_for(handle.result(), WAIT_S)
    assert result.state == "DONE" and result.solved == [True, True]
    history = await handle.fetch_history()
    assert not marked(history) and "execute" in scheduled(history)
    await replay(history, AgentTaskWorkflow)


async def test_tests_past_the_checked_bound_are_not_parsed_at_the_start(
    temporal_server, namespace
) -> None:
    """Past `CHECKED_TESTS_CHARS` the check is left out (its parse, under the GIL, made 1.5 MB of
    tests a deadlocked workflow task, retried for ever): such a task, broken here, goes on to
    `generate` (no model serves it: it is terminated there)."""
    client = await connect(temporal_server.address, namespace)
    lines = agent_task.CHECKED_TESTS_CHARS // len(PLAIN_ASSERTS) + 1
    raw = hand_started(tests=PLAIN_ASSERTS * lines)
    async with running_workers(client, {Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]}}):
        handle = await start_raw(client, raw)
        for _ in range(WAIT_S * 10):
            history = await handle.fetch_history()
            running = (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
            if scheduled(history) or not running:
                break
            await asyncio.sleep(0.1)
        if running:
            await handle.terminate("the test looked")
    assert scheduled(history) == ["generate"] and not marked(history)


@pytest.mark.slow  # a recorder: `make test` leaves it out, `make test-all` skips it
@pytest.mark.skipif(not os.environ.get("TEMPERED_RECORD_HISTORIES"), reason="records a history")
async def test_record_before(
    temporal_server,
    namespace,
    store: ObjectStore,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(b) as the release before the patch ran it: every program failed, DONE, no marker."""
    patch_answers(monkeypatch, PATCH, False)
    settings = settings_for(store, temporal_server.address, namespace, tmp_path)
    client = await connect(temporal_server.address, namespace)
    model = ScriptedModel(store, lambda sample, turn: RIGHT)
    raw = hand_started(tests=PLAIN_ASSERTS) | {"max_turns": 2}
    async with running_workers(client, task_workers(settings, store, model)):
        handle = await start_raw(client, raw, BEFORE_ID)
        result = await asyncio.wait_for(handle.result(), WAIT_S)
    assert result.state == "DONE" and result.solved == [False, False]
    history = await handle.fetch_history()
    assert not marked(history)
    BEFORE.write_text(WorkflowHistory(BEFORE_ID, history.events).to_json())


async def test_a_broken_task_started_before_the_check_replays() -> None:
    """(b) recorded before the check: no marker asked then, so it replays to DONE as it ran."""
    history = WorkflowHistory.from_json(BEFORE_ID, json.loads(BEFORE.read_text()))
    assert not marked(history) and scheduled(history).count("execute") == 2
    await replay(history, AgentTaskWorkflow)


async def test_the_history_before_the_check_replays_on_its_branch_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On its `branch_only` copy (tests/workflows/replaying.py), (b) replays with the check
    answered False (the release before it) and fails with True: the check fails the task at its
    start, where (b) went on to `execute`."""
    history = WorkflowHistory.from_json(BEFORE_ID, json.loads(BEFORE.read_text()))
    await replays_on_its_branch_only(monkeypatch, history, PATCH, False, AgentTaskWorkflow)
