"""`close_sessions` heartbeats while it waits (real bwrap sessions, real SeaweedFS, the real
dev server enforcing the heartbeat timeout): a close waits for each session's lock, which an
old attempt of a step still running its command holds for up to `limits.timeout_s`. Before,
the close sent no heartbeat: past its heartbeat timeout it failed (and was retried, then
logged as failed by the workflow, though the removal went on), and no cancel could reach it."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
import pytest_asyncio
from temporalio import workflow
from temporalio.testing import ActivityEnvironment

from activities.environment import EnvironmentActivities
from contracts.episode import CloseSessionsRequest, CloseSessionsResponse, OpenSessionsRequest
from contracts.names import Activity, Queue
from contracts.task import EnvName
from infra.environments.mounts import remove_tree
from infra.sandbox.local import LocalBackend
from infra.settings import SandboxSettings, Settings, WorkspaceSettings
from infra.storage import ObjectStore
from infra.tasks.workspace import workspace_tasks
from tests.infra.environments.conftest import needs_root, session_root
from tests.workflows.harness import connect, running_workers
from workflows.activity_options import activity_options

pytestmark = [needs_root, pytest.mark.asyncio]
QUEUE = "sandbox-close62"
HEARTBEAT_S = 1.0
HOLD_S = 4 * HEARTBEAT_S
"""How long a step (the test) holds a session's lock while the close waits for it."""
TASK = workspace_tasks()[4]


@workflow.defn(name="CloseSessions62", sandboxed=False)
class CloseSessions:
    """One `close_sessions`, with the options the workflows give it, but one attempt."""

    @workflow.run
    async def run(self, req: CloseSessionsRequest) -> CloseSessionsResponse:
        return await workflow.execute_activity(
            Activity.CLOSE_SESSIONS.value,
            req,
            result_type=CloseSessionsResponse,
            **activity_options(Activity.CLOSE_SESSIONS, HEARTBEAT_S, queue=QUEUE, attempts=1),
        )


@pytest_asyncio.fixture
async def acts(store: ObjectStore) -> AsyncIterator[EnvironmentActivities]:
    root = session_root()
    settings = Settings(sandbox=SandboxSettings(workspaces=WorkspaceSettings(root=root)))
    activities = EnvironmentActivities(settings, QUEUE, store, LocalBackend(warm=0))
    for key, data in TASK.objects.items():
        store.put_bytes(key, data)
    try:
        yield activities
    finally:
        await activities.close()
        await activities.backend.close()
        assert root.name.startswith("tempered-test-sessions-") and root.parent.name == "tmp"
        remove_tree(root)


async def test_a_close_waiting_on_a_session_lock_past_its_heartbeat_timeout_completes(
    temporal_server, namespace, acts: EnvironmentActivities
) -> None:
    assert TASK.spec.workspace is not None
    opened = await ActivityEnvironment().run(
        acts.open_sessions,
        OpenSessionsRequest(
            run_id="run-close62",
            task_id=TASK.spec.id,
            env=EnvName.WORKSPACE,
            workspace=TASK.spec.workspace,
            samples=[0, 1],
        ),
    )
    ids = [ref.session_id for ref in opened.sessions.values()]
    lock = acts.host.sessions[ids[0]].lock
    await lock.acquire()  # as a step's old attempt, still running its command

    async def hold() -> float:
        """Release the lock `HOLD_S` after the close took the session (it forgets it first)."""
        while ids[0] in acts.host.sessions:
            await asyncio.sleep(0.05)
        taken = time.monotonic()
        await asyncio.sleep(HOLD_S)
        lock.release()
        return taken

    holding = asyncio.ensure_future(hold())
    client = await connect(temporal_server.address, namespace)
    workers: dict[Queue | str, dict[str, Sequence[Any]]] = {
        QUEUE: {"activities": [acts.close_sessions], "workflows": [CloseSessions]}
    }
    async with running_workers(client, workers):
        closed = await client.execute_workflow(
            CloseSessions.run,
            CloseSessionsRequest(session_ids=ids),
            id=f"close62-{uuid.uuid4().hex[:6]}",
            task_queue=QUEUE,
        )
    assert closed.closed == 2  # before: the activity's heartbeat timeout failed the workflow
    assert time.monotonic() - await holding >= HOLD_S  # it waited for the lock
    assert not acts.host.sessions and not acts.host.closing
