"""Worker versioning of the workflow worker: running workflows finish on the code that started
them.

The agent-tasks worker (the only one with workflows) polls as version `<deployment>.<build>` of
a Temporal Worker Deployment, `PINNED` by default: a workflow stays on the build that ran its
first task, children start on their parent's build, and `LearnerWorkflow` and
`TrainingRunWorkflow` move to the current build at their next continue-as-new (they ask for
`AUTO_UPGRADE` there). Activity workers are unversioned: their contracts change additively (a
request field with a default, never a response field: a pinned build's contracts refuse unknown
fields, so its workflows could not decode the response).

    config = deployment_config(settings, plan)     # None for activity workers, or versioning off
    promote_in_background(client, settings, config)   # current once polling, unless a newer build is

The build id is `settings.temporal.build_id` (e.g. the image tag) or a digest of the code that
decides a workflow's commands (the `workflows` and `contracts` packages), so an unchanged
workflow keeps its build across releases of everything else. What versioning does not cover —
workflows started before it, and changes made in place — is `workflow.patched`'s, checked by
tests/workflows/test_replay.py against the previous release's histories.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import logging
from pathlib import Path

from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.service import RPCError
from temporalio.worker import WorkerDeploymentConfig

from infra.settings import Settings
from workers.plan import WorkerPlan

PROMOTE_TIMEOUT_S = 60.0
"""How long a new build waits to be registered (its first poll) before it is made current."""
log = logging.getLogger("tempered.worker")
_promotions: set[asyncio.Task[None]] = set()  # referenced until done


def code_digest(*packages: str) -> str:
    """12 hex digits over every module of the named top-level packages (read, not imported)."""
    digest = hashlib.sha256()
    for package in packages:
        spec = importlib.util.find_spec(package)
        assert spec is not None and spec.submodule_search_locations, package
        root = Path(spec.submodule_search_locations[0])
        for path in sorted(root.rglob("*.py")):
            digest.update(path.relative_to(root.parent).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def workflow_code_digest() -> str:
    """The digest of what decides a workflow's commands: the `workflows` and `contracts` packages."""
    return code_digest("workflows", "contracts")


def activity_code_digest() -> str:
    """The digest of what an activity worker runs: every package but `workflows`."""
    return code_digest("contracts", "infra", "activities", "workers")


def build_id(settings: Settings) -> str:
    return settings.temporal.build_id or workflow_code_digest()


def deployment_config(settings: Settings, plan: WorkerPlan) -> WorkerDeploymentConfig | None:
    """The versioning of a worker serving `plan`: pinned for workflows, none for activities."""
    if settings.temporal.versioning == "off" or not plan.workflows:
        return None
    return WorkerDeploymentConfig(
        version=WorkerDeploymentVersion(settings.temporal.deployment, build_id(settings)),
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.PINNED,
    )


async def promote(client: Client, version: WorkerDeploymentVersion) -> None:
    """Make `version` its deployment's current version, as soon as the server knows it, unless
    a build created after it is current: a restarted old-build pod (a crash, an eviction, a
    scale-up during an upgrade's overlap) must not move new workflows back to old code."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PROMOTE_TIMEOUT_S
    while True:
        try:
            decision = await _promote_once(client, version)
        except RPCError as err:  # not registered yet (no poll), or current changed meanwhile
            decision = str(err)
        if decision is None:
            log.info("build %s of %s is current", version.build_id, version.deployment_name)
            return
        if decision.startswith("kept "):
            log.info(
                "build %s of %s not made current: %s",
                version.build_id,
                version.deployment_name,
                decision,
            )
            return
        if loop.time() > deadline:
            raise RuntimeError(f"could not make {version} current: {decision}")
        await asyncio.sleep(0.25)


async def _promote_once(client: Client, version: WorkerDeploymentVersion) -> str | None:
    """None once `version` is current; "kept ..." where a newer build is current (left so);
    otherwise why not yet. Versions are ordered by the server's create time (first poll)."""
    described = await client.workflow_service.describe_worker_deployment(
        DescribeWorkerDeploymentRequest(
            namespace=client.namespace, deployment_name=version.deployment_name
        )
    )
    info = described.worker_deployment_info
    created = {
        s.deployment_version.build_id: s.create_time.ToNanoseconds() for s in info.version_summaries
    }
    if version.build_id not in created:
        return "not registered yet (no poll)"
    current = info.routing_config.current_deployment_version.build_id
    if current == version.build_id:
        return None
    if current and created.get(current, 0) > created[version.build_id]:
        return f"kept the newer build {current} current"
    await client.workflow_service.set_worker_deployment_current_version(
        SetWorkerDeploymentCurrentVersionRequest(
            namespace=client.namespace,
            deployment_name=version.deployment_name,
            build_id=version.build_id,
            conflict_token=described.conflict_token,  # fails if current changed since
            identity=client.identity,
        )
    )
    return None


def promote_in_background(
    client: Client, settings: Settings, config: WorkerDeploymentConfig | None
) -> None:
    """`promote` once the worker polls (when versioned and `settings.temporal.promote`); never
    back to an older build."""
    if config is None or not settings.temporal.promote:
        return
    task = asyncio.create_task(promote(client, config.version))
    _promotions.add(task)
    task.add_done_callback(_promoted)


def _promoted(task: asyncio.Task[None]) -> None:
    _promotions.discard(task)
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("%s: workflows on this queue wait until a build is made current", error)
