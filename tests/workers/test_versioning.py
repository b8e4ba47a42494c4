"""Worker versioning on the real dev server: a workflow that started on one build of the
agent-tasks worker finishes on it after a new build became current; new workflows start on the
new build. Both workers are built by `workers.runtime.build_worker`, as `tempered worker` does.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path

import pytest
from temporalio.api.workflowservice.v1 import DescribeWorkerDeploymentRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from contracts.learner import LearnerInput
from contracts.names import Queue
from infra.settings import Settings
from workers.runtime import build_worker, connect
from workers.versioning import workflow_code_digest
from workflows.learner import LearnerWorkflow


def settings(address: str, namespace: str, build: str, home: Path) -> Settings:
    return Settings(
        home=home, temporal={"address": address, "namespace": namespace, "build_id": build}
    )


async def builds_that_ran(handle: WorkflowHandle[LearnerWorkflow, LearnerInput]) -> set[str]:
    """Build ids of every workflow task the handle's workflow completed."""
    history = await handle.fetch_history()
    return {
        e.workflow_task_completed_event_attributes.deployment_version.build_id
        for e in history.events
        if e.HasField("workflow_task_completed_event_attributes")
    }


async def start_learner(client: Client) -> WorkflowHandle[LearnerWorkflow, LearnerInput]:
    """A learner that waits for groups (so it is running when the build changes)."""
    return await client.start_workflow(
        LearnerWorkflow.run,
        LearnerInput(run_id="versioning", max_steps=1),
        id=f"learner-{uuid.uuid4().hex[:8]}",
        task_queue=Queue.AGENT_TASKS.value,
    )


async def wait_until_running_on(
    handle: WorkflowHandle[LearnerWorkflow, LearnerInput], build: str
) -> None:
    for _ in range(100):
        if build in await builds_that_ran(handle):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{handle.id} never ran a workflow task on {build}")


async def wait_until_current(client: Client, settings: Settings, attempts: int = 300) -> None:
    """Until the worker of `settings`'s build polled and was made its deployment's current
    version (a fixed 2 s wait ran out on a slower machine: 1.2-1.7 s here under load)."""
    request = DescribeWorkerDeploymentRequest(
        namespace=client.namespace, deployment_name=settings.temporal.deployment
    )
    for _ in range(attempts):
        try:
            described = await client.workflow_service.describe_worker_deployment(request)
        except RPCError:  # no worker of the deployment polled yet
            described = None
        routing = described.worker_deployment_info.routing_config if described else None
        if routing and routing.current_deployment_version.build_id == settings.temporal.build_id:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"build {settings.temporal.build_id} was never made current")


@pytest.mark.asyncio
async def test_running_workflows_finish_on_their_build(
    temporal_server, namespace, tmp_path: Path
) -> None:
    old = settings(temporal_server.address, namespace, "b1", tmp_path)
    new = settings(temporal_server.address, namespace, "b2", tmp_path)
    client = await connect(old)
    old_worker, _ = await build_worker(client, Queue.AGENT_TASKS, old)
    async with old_worker:
        running = await start_learner(client)
        await wait_until_running_on(running, "b1")
        new_worker, _ = await build_worker(client, Queue.AGENT_TASKS, new)
        async with new_worker:
            await wait_until_current(client, new)
            started_later = await start_learner(client)
            await wait_until_running_on(started_later, "b2")
            for handle in (running, started_later):
                await handle.signal(LearnerWorkflow.finish)
                await handle.result()
    assert await builds_that_ran(running) == {"b1"}
    assert await builds_that_ran(started_later) == {"b2"}
    description = await running.describe()
    versioning = description.raw_description.workflow_execution_info.versioning_info
    assert versioning.deployment_version.build_id == "b1"


def test_build_id_is_a_digest_of_the_workflow_code() -> None:
    digest = workflow_code_digest()
    assert len(digest) == 12 and digest == workflow_code_digest()
    assert Settings(temporal={"build_id": "v1.2"}).temporal.build_id == "v1.2"


@pytest.mark.asyncio
async def test_an_old_build_restarting_does_not_become_current_again(
    temporal_server, namespace, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An old-build pod that restarts during an upgrade's overlap (a crash, an eviction, a
    scale-up) must not move new workflows back to its code: current stays the newer build."""
    b1 = settings(temporal_server.address, namespace, "b1", tmp_path)
    b2 = settings(temporal_server.address, namespace, "b2", tmp_path)
    client = await connect(b1)
    for build in (b1, b2):
        worker, _ = await build_worker(client, Queue.AGENT_TASKS, build)
        async with worker:
            await wait_until_current(client, build)
    caplog.set_level(logging.INFO, logger="tempered.worker")
    restarted, _ = await build_worker(client, Queue.AGENT_TASKS, b1)
    async with restarted:
        for _ in range(300):  # until its promotion decided
            if any("b1" in r.getMessage() and "current" in r.getMessage() for r in caplog.records):
                break
            await asyncio.sleep(0.1)
        await wait_until_current(client, b2, attempts=1)
    assert "build b1 of tempered not made current: kept the newer build b2 current" in caplog.text
