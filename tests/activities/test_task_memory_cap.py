"""The sandbox worker caps a task's stated memory (`[environment] memory_mb`) at its operator's
`sandbox.workspaces.max_task_memory_mb`, through the session activities, with real bwrap and a
real SeaweedFS.

Any task.toml could give each of its sandboxes up to 64 GB (`WorkspaceSpec.limits_of` replaced
the run's memory with the task's, unbounded): eight sandboxes of a worker could reach 512 GB.
A task asking more than the cap still runs, its steps and its check within the cap, and the
worker warns once, naming the task, its ask and the cap.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from temporalio.testing import ActivityEnvironment

from activities.environment import EnvironmentActivities
from contracts.common import ObjectRef
from contracts.episode import (
    EnvStepItem,
    EnvStepRequest,
    OpenSessionsRequest,
    ToolCall,
    VerifyItem,
    VerifyRequest,
)
from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import EnvName, SandboxLimits
from infra.storage import ObjectStore
from infra.tasks.harbor import load_task
from tests.activities.environment_rig import environment_activities
from tests.infra.environments.conftest import needs_root
from tests.infra.tasks.harbor_review_tasks import harbor_task

pytestmark = [needs_root, pytest.mark.asyncio]
RUN = "run-task-memory-cap"
LIMITS = SandboxLimits(timeout_s=30)  # memory_mb: 512, the run's
CAP = 1024
COMPLETION = ObjectRef(key="runs/x/completion.json", size=0, sha256="0" * 64)


def allocate(mb: int) -> str:
    """A command that writes `mb` MB (every page charged to the command's memory)."""
    return f"python3 -c 'b = b\"x\" * ({mb} << 20); print(len(b) >> 20)'"


async def activities(store: ObjectStore, **workspaces: int) -> AsyncIterator[EnvironmentActivities]:
    async with environment_activities(store, "sandbox-memory-cap", **workspaces) as acts:
        yield acts


@pytest_asyncio.fixture
async def capped(store: ObjectStore) -> AsyncIterator[EnvironmentActivities]:
    """A worker whose operator caps a task's memory at `CAP` MB."""
    async for acts in activities(store, max_task_memory_mb=CAP):
        yield acts


@pytest_asyncio.fixture
async def default(store: ObjectStore) -> AsyncIterator[EnvironmentActivities]:
    """A worker with the default cap."""
    async for acts in activities(store):
        yield acts


async def run_task(
    acts: EnvironmentActivities, store: ObjectStore, tmp_path: Path, name: str,
    commands: list[str], test: str,
) -> tuple[list[ExecStatus | None], ExecutionResult, float]:  # fmt: skip
    """A Harbor task `name` asking 8192 MB, its test `test`: one session, one step per command,
    then its final tree verified. The steps' statuses, the verdict's result and its score."""
    directory = harbor_task(tmp_path, name)
    (directory / "task.toml").write_text(
        "[environment]\nmemory_mb = 8192\n[verifier]\ntimeout_sec = 30.0\n"
    )
    (directory / "tests" / "test.sh").write_text(f"#!/bin/bash\n{test}\n")
    loaded = load_task(directory, suite="harbor:x")
    for key, data in loaded.objects.items():
        store.put_bytes(key, data)
    workspace = loaded.spec.workspace
    assert workspace is not None and workspace.memory_mb == 8192
    task_id, env = loaded.spec.id, EnvName.WORKSPACE
    opened = OpenSessionsRequest(
        run_id=RUN, task_id=task_id, env=env, workspace=workspace, samples=[0], limits=LIMITS
    )
    session = (await ActivityEnvironment().run(acts.open_sessions, opened)).sessions[0]
    statuses = []
    for step, command in enumerate(commands):
        call = ToolCall(name="bash", arguments={"command": command})
        item = EnvStepItem(sample=0, session=session, completion=COMPLETION, call=call)
        req = EnvStepRequest(
            run_id=RUN, task_id=task_id, step=step, env=env, limits=LIMITS, items=[item]
        )
        (outcome,) = (await ActivityEnvironment().run(acts.env_step, req)).outcomes
        statuses.append(outcome.status)
        session = outcome.session
    final = VerifyItem(sample=0, snapshot=session.snapshot)
    verify = VerifyRequest(
        run_id=RUN, task_id=task_id, env=env, workspace=workspace, limits=LIMITS, items=[final]
    )
    (verdict,) = (await ActivityEnvironment().run(acts.verify_episodes, verify)).verdicts
    return statuses, store.get_model(verdict.result.key, ExecutionResult), verdict.score


def cap_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The worker's warnings of a capped task (not the loader's)."""
    worker = [r for r in caplog.records if r.name == "tempered.environments"]
    return [r.getMessage() for r in worker if "max_task_memory_mb" in r.getMessage()]


async def test_a_task_asking_8192_mb_runs_its_steps_and_check_under_the_cap(
    capped: EnvironmentActivities, store: ObjectStore, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    test = f"{allocate(700)} && echo 1 > /logs/verifier/reward.txt"
    with caplog.at_level(logging.WARNING):
        statuses, result, score = await run_task(
            capped, store, tmp_path, "cap-steps", [allocate(1200), allocate(700)], test
        )
    assert statuses == [ExecStatus.MEMORY_EXCEEDED, ExecStatus.PASSED]  # 1200 MB past the cap
    assert score == 1.0 and result.status is ExecStatus.PASSED, result  # it ran, capped
    assert result.limits.memory_mb == CAP
    (line,) = cap_warnings(caplog)  # once for the task: not once per step or check
    assert "cap-steps" in line and "8192 MB" in line and f"{CAP} MB" in line, line


async def test_the_check_of_a_task_asking_8192_mb_runs_under_the_cap(
    capped: EnvironmentActivities, store: ObjectStore, tmp_path: Path
) -> None:
    test = f"{allocate(1200)} && echo 1 > /logs/verifier/reward.txt"
    _, result, score = await run_task(capped, store, tmp_path, "cap-check", [], test)
    assert result.status is ExecStatus.MEMORY_EXCEEDED and score == 0.0, result
    assert result.limits.memory_mb == CAP


async def test_the_default_cap_is_4096_mb(
    default: EnvironmentActivities, store: ObjectStore, tmp_path: Path
) -> None:
    test = "echo 1 > /logs/verifier/reward.txt"
    statuses, result, score = await run_task(
        default, store, tmp_path, "cap-default", ["true"], test
    )
    assert statuses == [ExecStatus.PASSED] and score == 1.0, result
    assert result.limits.memory_mb == 4096
