"""A group whose steps together pass a payload's bound (`EPISODES_BYTES`), through
AgentTaskWorkflow on the real dev server and real S3 (scripted model and sandbox,
tests/workflows/harness.py): its trajectories are written in parts of whole
episodes (`write_trajectories_parts`, behind `TRAJECTORY_PARTS_PATCH`), every one once, and its
`status` query answers what fits (`EpisodeGroup.summaries`).

Before, `write_trajectories` carried every step of all G episodes in one payload: past about
2,150 episode-steps (G=128 at 20 steps of 1 KB writes: 2.4 MiB) the SDK refused the command
(TMPRL1103) on every retry of the workflow task, and the task hung at DONE for ever; the
`status` query carried the same steps ("Blob data size exceeds limit"). Such a group is now
refused (`MAX_GROUP_STEPS`), but the largest accepted one still needs parts."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle, WorkflowHistory

from contracts.common import ObjectRef
from contracts.episode import ToolCall
from contracts.rollout import (
    AgentTaskResult,
    EpisodeState,
    EpisodeStep,
    TaskStatus,
    WriteTrajectoriesRequest,
)
from contracts.task import AgentTaskInput
from infra import keys
from infra.storage import ObjectStore
from tests.workflows.harness import ScriptedModel, ScriptedSandbox, connect, running_workers, start
from tests.workflows.test_episodes import task_input, workers, write
from workflows.agent_task import AgentTaskWorkflow
from workflows.budget import PAYLOAD_LIMIT
from workflows.episodes import EpisodeGroup
from workflows.requests import EPISODES_BYTES, json_bytes, write_trajectories_parts

FILE_CHARS = 1024
SIZES = [
    # 640 steps, ~0.55 MiB: two parts, under the 2 MiB bound (about 890 bytes an episode-step:
    # 12x24 fits one request; fewer than ~570 steps would prove nothing)
    pytest.param(32, 20, id="G=32x20", marks=pytest.mark.slow),
    # 768 steps, the most `MAX_GROUP_STEPS` allows, the widest (G=128x20, 2,560 steps and ~2.4
    # MiB in one request, which the SDK refused, is now refused by `AgentTaskInput`)
    pytest.param(96, 8, id="G=96x8", marks=pytest.mark.slow),
]
"""Groups of episodes that write a 1 KB file at every step (its brief: ~1 KB a step). Both are
slow: in `make test`, `written_in_parts` runs on the G=256x3 group (768 steps, ~7 KB each) of
tests/workflows/test_agent_task_history_bound.py, which needs parts too."""


def content(sample: int, step: int) -> str:
    line = f"# sample {sample} step {step}: a line of a realistic source file\n"
    return (line * (FILE_CHARS // len(line) + 1))[:FILE_CHARS]


def writes(sample: int, step: int) -> ToolCall:
    return write(f"src/module_{step % 3}.py", content(sample, step))


async def result_or_refusal(handle: WorkflowHandle, timeout_s: float) -> AgentTaskResult:
    """The task's result; fails the test at once when a workflow task of it failed (the SDK's
    refusal of a payload is retried for ever: waiting would only time out)."""
    waiting = asyncio.ensure_future(handle.result())
    try:
        for _ in range(int(timeout_s)):
            done, _pending = await asyncio.wait({waiting}, timeout=1)
            if done:
                return waiting.result()
            history = await handle.fetch_history()
            failed = [
                e.workflow_task_failed_event_attributes.failure.message
                for e in history.events
                if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
            ]
            if failed:
                await handle.terminate("the test gave up on it")
                pytest.fail(f"a workflow task of the task failed: {failed[-1][:300]}")
        await handle.terminate("the test gave up on it")
        pytest.fail(f"the task did not finish in {timeout_s} s")
    finally:
        waiting.cancel()


@pytest.mark.parametrize(("group", "steps"), SIZES)
@pytest.mark.asyncio
async def test_a_group_past_a_payload_writes_its_trajectories_in_parts(
    temporal_server, namespace, store: ObjectStore, group: int, steps: int
) -> None:
    client = await connect(temporal_server.address, namespace)
    sandbox = ScriptedSandbox(store, "a")
    model = ScriptedModel(store, writes)
    task = task_input(
        store,
        f"parts-{uuid.uuid4().hex[:6]}",
        group_size=group,
        max_turns=steps,
        max_context_tokens=1 << 16,
    )
    async with running_workers(client, {**workers(model, store), **sandbox.workers()}):
        handle = await start(client, task)
        result = await result_or_refusal(handle, 400)
        status: TaskStatus = await handle.query(AgentTaskWorkflow.status)
    history = await handle.fetch_history()
    written_in_parts(store, task, result, status, history)


def written_in_parts(
    store: ObjectStore,
    task: AgentTaskInput,
    result: AgentTaskResult,
    status: TaskStatus,
    history: WorkflowHistory,
    *,
    latest_fit: bool = True,
) -> None:
    """Assert that `task`'s finished group, every episode at its step budget, wrote its
    trajectories in parts, each within a payload, and its `status` answered what fits (also run
    on G=256x3 in tests/workflows/test_agent_task_history_bound.py, in `make test`). With
    `latest_fit`, each episode's latest step fits an even share of the payload (1 KB writes,
    G=32 or 96): the status shows it."""
    group, steps = task.group_size, task.max_turns
    assert result.steps == [steps] * group and result.ends == ["step_budget"] * group
    assert [r.key for r in result.trajectories] == [
        keys.trajectory_key(task.run_id, task.task.id, s) for s in range(group)
    ]
    stored = sorted(store.list_keys(keys.trajectories_prefix(task.run_id)))
    assert stored == sorted(r.key for r in result.trajectories)

    # several requests of whole episodes, each within a payload, every sample in one of them
    # once, and every trajectory created once (the parts' `created` add up to the group)
    requests = [
        e.activity_task_scheduled_event_attributes.input.payloads[0].data
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == "write_trajectories"
    ]
    assert len(requests) > 1 and all(len(r) <= EPISODES_BYTES < PAYLOAD_LIMIT for r in requests)
    parts = [json.loads(r) for r in requests]
    assert [s["sample"] for p in parts for s in p["samples"]] == list(range(group))
    assert all(len(s["steps"]) == steps for p in parts for s in p["samples"])
    assert {p["group_size"] for p in parts} == {group}
    responses = [
        json.loads(e.activity_task_completed_event_attributes.result.payloads[0].data)
        for e in history.events
        if e.HasField("activity_task_completed_event_attributes")
        and "created" in e.activity_task_completed_event_attributes.result.payloads[0].data.decode()
    ]
    assert sum(r["created"] for r in responses) == group

    # the status query answers within a payload: every episode, its figures and latest steps,
    # exactly as `EpisodeGroup.summaries` shows the episodes written
    assert status.state == "DONE" and [e.sample for e in status.samples] == list(range(group))
    assert len(status.model_dump_json()) < EPISODES_BYTES + 1024
    assert all(e.end == "step_budget" and e.session for e in status.samples)
    written = EpisodeGroup(task)
    written.episodes = [
        e for p in parts for e in WriteTrajectoriesRequest.model_validate(p).samples
    ]
    assert status.samples == written.summaries() != written.episodes
    assert all(
        [k.step for k in e.steps] == list(range(steps - len(e.steps), steps))
        for e in status.samples
    )
    if latest_fit:  # a step of each episode fits its share of the payload: it is shown
        assert all(e.steps and e.steps[-1].step == steps - 1 for e in status.samples)
    size = sum(event.ByteSize() for event in history.events)
    print(
        f"\nG={group} × {steps} steps: {len(requests)} write_trajectories parts, "
        f"{len(history.events)} events, {size / 2**20:.1f} MiB of history"
    )


def test_parts_hold_whole_episodes_within_the_budget_in_sample_order(store: ObjectStore) -> None:
    """`write_trajectories_parts`: one request while the group fits; else parts of whole
    episodes, each within the budget (an episode larger alone), every episode once, in order."""
    ref = ObjectRef(key="runs/r/t/s0/completion.json", size=1, sha256="0" * 64)
    task = task_input(store, "parts", group_size=6, max_turns=40)

    def episode(sample: int, steps: int) -> EpisodeState:
        step = EpisodeStep(step=0, policy_version=0, completion=ref, call=writes(sample, 0).brief())
        return EpisodeState(sample=sample, end="step_budget", steps=[step] * steps)

    group = [episode(s, n) for s, n in enumerate([3, 3, 40, 3, 3, 3])]
    (whole,) = write_trajectories_parts(task, group)
    assert whole.samples == group and whole.group_size == 6

    budget = json_bytes(whole) // 3
    parts = write_trajectories_parts(task, group, budget)
    assert [[e.sample for e in p.samples] for p in parts] == [[0, 1], [2], [3, 4, 5]]
    assert json_bytes(group[2]) > budget  # alone, over the budget: still written
    assert all(json_bytes(p) <= budget for p in parts if len(p.samples) > 1)
    assert all(p.group_size == 6 and p.task == task.task for p in parts)


def test_the_status_shows_what_fits(store: ObjectStore) -> None:
    """`EpisodeGroup.summaries`: the episodes whole while they fit; else each episode's figures
    and its latest steps within an even share of the budget."""
    ref = ObjectRef(key="runs/r/t/s0/completion.json", size=1, sha256="0" * 64)
    group = EpisodeGroup(task_input(store, "status", group_size=4, max_turns=40))
    for episode in group.episodes:
        episode.steps = [
            EpisodeStep(step=k, policy_version=0, completion=ref, call=writes(0, k).brief())
            for k in range(30)
        ]
        episode.reward = 0.5
    assert group.summaries() is group.episodes

    budget = sum(json_bytes(e) for e in group.episodes) // 3
    shown = group.summaries(budget)
    assert sum(json_bytes(e) for e in shown) <= budget
    for episode in shown:
        assert 0 < len(episode.steps) < 30 and episode.steps[-1].step == 29
        assert [s.step for s in episode.steps] == list(range(30 - len(episode.steps), 30))
        assert episode.reward == 0.5
    assert all(len(e.steps) == 30 for e in group.episodes)  # the group itself is untouched
