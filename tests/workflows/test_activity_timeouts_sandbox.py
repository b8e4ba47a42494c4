"""The start-to-close an `execute`, `env_step` or `verify_episodes` is scheduled with, read from
the history of a real AgentTaskWorkflow on the dev server (workflows/activity_options.py).

Every item of these activities waits for one of its worker's `sandbox.concurrency` program
slots, so one attempt takes up to `items` program limits. The start-to-close was a fixed 2-hour
backstop: a group of 4 at the 1-hour limit (`SandboxLimits.timeout_s` ≤ 3600) on a worker of
fewer slots timed out at every attempt, and each retry ran every item again, for ever (an
`env_step`'s attempts ran out and the run failed as SessionLost). Each must outlast its own
items run one at a time: `len(items)` × the limit.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHistory

from activities.rewards import RewardActivities
from activities.sandbox import SandboxActivities
from contracts.names import Activity, Queue
from contracts.rollout import AgentTaskResult
from contracts.task import MAX_CHECK_S, AgentTaskInput, SandboxLimits, TaskSpec
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.workflows.harness import ScriptedModel, ScriptedSandbox, connect, running_workers, start
from tests.workflows.test_episodes import solver, task_input, workers
from workflows.agent_task import AgentTaskWorkflow

HOUR = 3600.0
"""The longest program limit a task may ask (`SandboxLimits.timeout_s`'s bound)."""
GROUP = 4

ADD = TaskSpec(
    id="add",
    prompt="Write add(a, b) returning a + b.",
    entry_point="add",
    tests="def check(candidate):\n    assert candidate(2, 3) == 5\n",
)


def scheduled(history: WorkflowHistory, kind: Activity) -> list[tuple[timedelta, int]]:
    """(start-to-close, items of its request) of every `kind` the workflow scheduled."""
    found = []
    for event in history.events:
        attributes = event.activity_task_scheduled_event_attributes
        if attributes.activity_type.name != kind.value:
            continue
        request = json.loads(attributes.input.payloads[0].data)
        found.append((attributes.start_to_close_timeout.ToTimedelta(), len(request["items"])))
    assert found, f"no {kind} scheduled"
    return found


def one_at_a_time(items: int, limit_s: float) -> timedelta:
    return timedelta(seconds=items * limit_s)


@pytest.mark.asyncio
async def test_an_execute_outlasts_its_items_run_one_at_a_time(
    temporal_server, namespace, store: ObjectStore, tmp_path: Path
) -> None:
    """A group of 4 programs, each allowed the hour: the execute's start-to-close is at least
    4 hours (it was 2)."""
    settings = Settings(
        home=tmp_path,
        temporal={"address": temporal_server.address, "namespace": namespace},
        s3=store.settings.model_copy(update={"bucket": store.bucket}),
    )
    client = await connect(temporal_server.address, namespace)
    model = ScriptedModel(store, lambda sample, turn: "def add(a, b):\n    return a + b\n")
    task = AgentTaskInput(
        task=ADD,
        run_id=f"tmo-{uuid.uuid4().hex[:6]}",
        group_size=GROUP,
        max_turns=1,
        limits=SandboxLimits(timeout_s=HOUR, cpu_s=10),
    )
    by_queue: dict[Queue | str, dict[str, Sequence[Any]]] = {
        Queue.AGENT_TASKS: {"workflows": [AgentTaskWorkflow]},
        Queue.INFERENCE: {"activities": [model.generate]},
        Queue.SANDBOX: {"activities": [SandboxActivities(settings, store).execute]},
        Queue.REWARDS: {"activities": [RewardActivities(store).write_trajectories]},
    }
    async with running_workers(client, by_queue):
        handle = await start(client, task)
        result: AgentTaskResult = await handle.result()
        history = await handle.fetch_history()

    assert result.solved == [True] * GROUP
    ((start_to_close, items),) = scheduled(history, Activity.EXECUTE)
    assert items == GROUP
    assert start_to_close >= one_at_a_time(items, HOUR), start_to_close


@pytest.mark.asyncio
async def test_env_steps_and_the_verify_outlast_their_items_run_one_at_a_time(
    temporal_server, namespace, store: ObjectStore
) -> None:
    """A workspace group of 4 at the hour's limit: each `env_step` is allowed its items' hours,
    the verify its items' (the untouched tree among them) at the longest check's."""
    client = await connect(temporal_server.address, namespace)
    sandbox = ScriptedSandbox(store, "a")
    model = ScriptedModel(store, solver)
    run_id = f"tmo-ws-{uuid.uuid4().hex[:6]}"
    limits = SandboxLimits(timeout_s=HOUR, cpu_s=10)
    async with running_workers(client, {**workers(model, store), **sandbox.workers()}):
        handle = await start(client, task_input(store, run_id, group_size=GROUP, limits=limits))
        await handle.result()
        history = await handle.fetch_history()

    steps = scheduled(history, Activity.ENV_STEP)
    assert max(items for _, items in steps) == GROUP  # every session on the one worker
    for start_to_close, items in steps:
        assert start_to_close >= one_at_a_time(items, HOUR), (start_to_close, items)
    ((start_to_close, items),) = scheduled(history, Activity.VERIFY_EPISODES)
    assert items == GROUP + 1  # the untouched workspace beside the group's
    assert start_to_close >= one_at_a_time(items, MAX_CHECK_S), start_to_close
