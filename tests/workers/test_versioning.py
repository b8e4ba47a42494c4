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
from workers import versioning
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
async def test_an_old_build_restarting_while_the_newer_runs_does_not_become_current(
    temporal_server, namespace, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An old-build pod that restarts during an upgrade's overlap (a crash, an eviction, a
    scale-up) must not move new workflows back to its code while the newer build's workers run:
    current stays the newer build, and a warning says how to move it by hand."""
    b1 = settings(temporal_server.address, namespace, "b1", tmp_path)
    b2 = settings(temporal_server.address, namespace, "b2", tmp_path)
    client = await connect(b1)
    worker, _ = await build_worker(client, Queue.AGENT_TASKS, b1)
    async with worker:
        await wait_until_current(client, b1)
    caplog.set_level(logging.INFO, logger="tempered.worker")
    newer, _ = await build_worker(client, Queue.AGENT_TASKS, b2)
    async with newer:
        await wait_until_current(client, b2)
        restarted, _ = await build_worker(client, Queue.AGENT_TASKS, b1)
        async with restarted:
            for _ in range(300):  # until its promotion decided
                if "build b1 of tempered not made current" in caplog.text:
                    break
                await asyncio.sleep(0.1)
            await wait_until_current(client, b2, attempts=1)
            started_later = await start_learner(client)
            await wait_until_running_on(started_later, "b2")
            await started_later.terminate()
    _stop_promotions()
    kept = [r for r in caplog.records if "build b1 of tempered not made current" in r.message]
    assert [r.levelno for r in kept] == [logging.WARNING]
    assert "kept the newer build b2 current" in kept[0].message
    assert "temporal worker deployment set-current-version" in kept[0].message
    assert "--build-id b1" in kept[0].message


@pytest.mark.asyncio
async def test_a_rolled_back_build_becomes_current_once_the_newer_has_no_worker(
    temporal_server, namespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rollback (helm rollback, the image tag set back, a local edit of workflows/ reverted)
    brings back an older build after the newer one's workers are gone. It was kept from being
    current, as a restarted old pod is, and new workflows went to the newer build, which no
    worker polls: they waited for ever. Polls are deemed live for 3 s here, not a minute."""
    monkeypatch.setattr(versioning, "LIVE_POLLER_S", 3.0)
    monkeypatch.setattr(versioning, "RECHECK_S", 0.5)
    b1 = settings(temporal_server.address, namespace, "b1", tmp_path)
    b2 = settings(temporal_server.address, namespace, "b2", tmp_path)
    client = await connect(b1)
    for build in (b1, b2):
        worker, _ = await build_worker(client, Queue.AGENT_TASKS, build)
        async with worker:
            await wait_until_current(client, build)
    rolled_back, _ = await build_worker(client, Queue.AGENT_TASKS, b1)  # the only worker now
    async with rolled_back:
        await wait_until_current(client, b1)
        started_later = await start_learner(client)
        await wait_until_running_on(started_later, "b1")
        await started_later.terminate()


def _stop_promotions() -> None:
    """Cancel the promotions still waiting (a kept build's), which would outlive the test."""
    for task in list(versioning._promotions):
        task.cancel()
