"""The largest groups `AgentTaskInput` accepts (`MAX_GROUP_STEPS` episode-steps) keep their
history under Temporal's warnings (10 MiB, 10,240 events; it fails a workflow at 50 MiB and
51,200), at their worst: run and task ids of 128 characters (in every key and session), and a
call at every step whose brief keeps the most an error call keeps (`MAX_KEPT_CHARS`),
through AgentTaskWorkflow on the real dev server and real S3 (scripted model and sandbox, with the
real sandbox worker's session ids and snapshot keys).

A history is `F(G) + T × (A + G × B)` for G episodes of T steps: B per episode-step, A per step,
F the start and end. At a given `G × T`, it is largest at either end: G=256 × 3 turns (run
here whole) and G=3 × 256 turns (a 16-step run here, its history scaled by 256 / 16, which
counts its F sixteen times: more than it is). Both stay within a quarter of the limits, with
2.5 MiB to spare for the prompt and tests every step repeats (this test's are short).

Before the bound, G=128 × 20 made 9.4 MiB (tests/workflows/test_agent_task_parts.py). The
widest group is also checked as that file checks a group past a payload (`written_in_parts`)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import NamedTuple

import pytest
from temporalio import activity
from temporalio.client import WorkflowHistory

from activities.environment import session_id
from contracts.common import MAX_ID
from contracts.episode import (
    BRIEF_CHARS,
    OpenSessionsRequest,
    OpenSessionsResponse,
    SessionRef,
    ToolCall,
)
from contracts.names import Activity, Queue
from contracts.rollout import AgentTaskResult, TaskStatus
from contracts.task import MAX_GROUP_STEPS, AgentTaskInput
from infra import keys
from infra.inference.toolcalls import MAX_KEPT_CHARS
from infra.storage import ObjectStore
from tests.workflows.harness import (
    ScriptedModel,
    ScriptedSandbox,
    connect,
    running_workers,
    tree_digest,
)
from tests.workflows.test_agent_task_parts import written_in_parts
from tests.workflows.test_episodes import task_input, workers, workspace_task
from workflows.agent_task import AgentTaskWorkflow

WARN_EVENTS, WARN_BYTES = 10_240, 10 * 2**20
"""Temporal's history warnings (`limit.historyCount.warn`, `limit.historySize.warn`)."""
QUARTER_BYTES = 50 * 2**20 // 4
"""A quarter of its limit, where it fails the workflow: `MAX_GROUP_STEPS`' bound."""
MAX_TURNS = 256
"""`AgentTaskInput.max_turns`' bound."""


class SandboxWithRealIds(ScriptedSandbox):
    """The scripted sandbox worker, whose session ids and snapshot keys are the real worker's
    (activities/environment.py: `s<sample>-<digest>`; runs/<run>/snapshots/<task>--s<sample>/)."""

    def __init__(self, store: ObjectStore, name: str):
        super().__init__(store, name)
        self.folders: dict[str, str] = {}

    def _ref(self, session: str) -> SessionRef:
        tree = self.sessions[session]
        digest = tree_digest(tree)
        snapshot = self.store.put_json(keys.snapshot_key(self.folders[session], digest), tree)
        return SessionRef(
            session_id=session, queue=self.queue, snapshot=snapshot, tree_digest=digest
        )

    @activity.defn(name=Activity.OPEN_SESSIONS.value)
    async def open_sessions(self, req: OpenSessionsRequest) -> OpenSessionsResponse:
        sessions = {}
        for sample in req.samples:
            source = req.snapshots.get(sample, req.workspace.files)
            session = f"{session_id(req.run_id, req.task_id, sample)}-{self.opened}"
            self.opened += 1
            self.folders[session] = f"runs/{req.run_id}/snapshots/{req.task_id}--s{sample}/"
            self.sessions[session] = json.loads(self.store.get_verified(source))
            sessions[sample] = self._ref(session)
        return OpenSessionsResponse(sessions=sessions)


def largest_call(sample: int, step: int) -> ToolCall:
    """The largest brief a call has: an unknown tool's, whose flat arguments it keeps up to
    `MAX_KEPT_CHARS` (7 values that each fill a brief's `BRIEF_CHARS`), with its error."""
    value = f"{step % 3}".ljust(BRIEF_CHARS - 6, "y")
    arguments = {f"arg{k}": value for k in range(7)}
    assert len(json.dumps(arguments)) <= MAX_KEPT_CHARS < len(json.dumps(arguments)) + 260
    return ToolCall(name="write", arguments=arguments)


class Finished(NamedTuple):
    """A group run to its end: its input, result, last `status` and history."""

    task: AgentTaskInput
    result: AgentTaskResult
    status: TaskStatus
    history: WorkflowHistory


async def history_of(
    temporal_server, namespace: str, store: ObjectStore, group: int, steps: int
) -> Finished:
    """A group of `group` episodes that each write for `steps` steps, run to its end."""
    client = await connect(temporal_server.address, namespace)
    sandbox = SandboxWithRealIds(store, "host-" + "h" * 20)
    model = ScriptedModel(store, largest_call)
    run_id = f"bound-{uuid.uuid4().hex[:6]}".ljust(MAX_ID, "r")
    task = task_input(
        store,
        run_id,
        task=workspace_task(store, "t" * MAX_ID),
        group_size=group,
        max_turns=steps,
        max_context_tokens=1 << 16,
    )
    async with running_workers(client, {**workers(model, store), **sandbox.workers()}):
        handle = await client.start_workflow(
            AgentTaskWorkflow.run,
            task,
            id=f"bound-{uuid.uuid4().hex}",
            task_queue=Queue.AGENT_TASKS.value,
        )
        result = await asyncio.wait_for(handle.result(), 120)
        status: TaskStatus = await handle.query(AgentTaskWorkflow.status)
    assert result.steps == [steps] * group  # every episode took every step
    return Finished(task, result, status, await handle.fetch_history())


def measured(history: WorkflowHistory) -> tuple[int, int]:
    """(events, bytes) of `history`."""
    return len(history.events), sum(event.ByteSize() for event in history.events)


@pytest.mark.asyncio
async def test_the_widest_group_accepted_stays_under_the_history_warnings(
    temporal_server, namespace, store: ObjectStore
) -> None:
    group = 256
    steps = MAX_GROUP_STEPS // group
    finished = await history_of(temporal_server, namespace, store, group, steps)
    events, size = measured(finished.history)
    print(f"\nG={group} × {steps} turns: {events} events, {size / 2**20:.2f} MiB")
    assert events < WARN_EVENTS and size < QUARTER_BYTES - 2.5 * 2**20
    assert size > WARN_BYTES / 2  # the worst case: not a bound met by a wide margin
    # its steps pass a payload: written in parts, the status within one (the parts test's G=32x20
    # and G=96x8 are slow; this group stands for them in `make test`). A step here (~7 KB) is
    # over a 256th of the payload: the status shows each episode's figures, none of its steps.
    written_in_parts(store, *finished, latest_fit=False)


@pytest.mark.asyncio
async def test_the_longest_group_accepted_stays_under_the_history_warnings(
    temporal_server, namespace, store: ObjectStore
) -> None:
    group = MAX_GROUP_STEPS // MAX_TURNS
    steps = 16
    history = (await history_of(temporal_server, namespace, store, group, steps)).history
    events, size = measured(history)
    scale = MAX_TURNS / steps
    print(
        f"\nG={group} × {steps} turns: {events} events, {size / 2**20:.2f} MiB; at {MAX_TURNS} "
        f"turns about {events * scale:.0f} events, {size * scale / 2**20:.2f} MiB"
    )
    assert group * MAX_TURNS == MAX_GROUP_STEPS
    assert events * scale < WARN_EVENTS and size * scale < QUARTER_BYTES - 2.5 * 2**20
    assert size * scale > WARN_BYTES / 2
