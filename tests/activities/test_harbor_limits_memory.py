"""A Harbor task's `[environment] memory_mb` is the memory limit of its agent's commands and of
its check, through the session activities, with real bwrap and a real SeaweedFS.

It was read, type-checked and warned of as "not applied": a task stating 1024 MB whose test
needed 700 MB ran under the run's 512 MB (`SandboxLimits.memory_mb`), its test hit the limit
(MEMORY_EXCEEDED) and a correct answer scored 0. Without the key the run's limit holds, as
before: both the step and the check hit it.
"""

from __future__ import annotations

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
RUN = "run-harbor-limits"
LIMITS = SandboxLimits(timeout_s=30)  # memory_mb: 512, the run's
COMPLETION = ObjectRef(key="runs/x/completion.json", size=0, sha256="0" * 64)
ALLOCATE = "python3 -c 'b = b\"x\" * (700 << 20); print(len(b) >> 20)'"
"""700 MB written (every page charged to the command's memory cgroup)."""
TEST = f"#!/bin/bash\n{ALLOCATE} && echo 1 > /logs/verifier/reward.txt\n"
"""The task's test: a reward of 1 once its 700 MB are had."""


@pytest_asyncio.fixture
async def acts(store: ObjectStore) -> AsyncIterator[EnvironmentActivities]:
    async with environment_activities(store, "sandbox-limits") as activities:
        yield activities


def task_dir(tmp_path: Path, environment: str) -> Path:
    """The fix-greeting example, its task.toml's `[environment]` table `environment`, its
    test `TEST`."""
    directory = harbor_task(tmp_path, "needs-memory")
    (directory / "task.toml").write_text(
        f"[environment]\n{environment}[verifier]\ntimeout_sec = 30.0\n"
    )
    (directory / "tests" / "test.sh").write_text(TEST)
    return directory


async def step_and_verify(
    acts: EnvironmentActivities, store: ObjectStore, directory: Path
) -> tuple[ExecStatus | None, ExecutionResult, float]:
    """The task loaded and stored; one step running `ALLOCATE`, then its final tree verified:
    the step's status, the verdict's result and its score."""
    loaded = load_task(directory, suite="harbor:x")
    for key, data in loaded.objects.items():
        store.put_bytes(key, data)
    workspace = loaded.spec.workspace
    assert workspace is not None
    task_id, env = loaded.spec.id, EnvName.WORKSPACE
    opened = OpenSessionsRequest(
        run_id=RUN, task_id=task_id, env=env, workspace=workspace, samples=[0], limits=LIMITS
    )
    sessions = (await ActivityEnvironment().run(acts.open_sessions, opened)).sessions
    call = ToolCall(name="bash", arguments={"command": ALLOCATE})
    item = EnvStepItem(sample=0, session=sessions[0], completion=COMPLETION, call=call)
    step = EnvStepRequest(run_id=RUN, task_id=task_id, step=0, env=env, limits=LIMITS, items=[item])
    (outcome,) = (await ActivityEnvironment().run(acts.env_step, step)).outcomes
    final = VerifyItem(sample=0, snapshot=outcome.session.snapshot)
    verify = VerifyRequest(
        run_id=RUN, task_id=task_id, env=env, workspace=workspace, limits=LIMITS, items=[final]
    )
    (verdict,) = (await ActivityEnvironment().run(acts.verify_episodes, verify)).verdicts
    return outcome.status, store.get_model(verdict.result.key, ExecutionResult), verdict.score


async def test_a_task_stating_1024_mb_runs_its_commands_and_check_within_it(
    acts: EnvironmentActivities, store: ObjectStore, tmp_path: Path
) -> None:
    directory = task_dir(tmp_path, "memory_mb = 1024\n")
    status, result, score = await step_and_verify(acts, store, directory)
    assert status is ExecStatus.PASSED, status
    assert score == 1.0 and result.status is ExecStatus.PASSED, result
    assert result.limits.memory_mb == 1024


async def test_the_older_memory_string_states_it_too(
    acts: EnvironmentActivities, store: ObjectStore, tmp_path: Path
) -> None:
    status, result, score = await step_and_verify(
        acts, store, task_dir(tmp_path, 'memory = "1G"\n')
    )
    assert status is ExecStatus.PASSED and score == 1.0, result


async def test_without_the_key_the_runs_512_mb_hold(
    acts: EnvironmentActivities, store: ObjectStore, tmp_path: Path
) -> None:
    status, result, score = await step_and_verify(acts, store, task_dir(tmp_path, ""))
    assert status is ExecStatus.MEMORY_EXCEEDED, status
    assert score == 0.0 and result.status is ExecStatus.MEMORY_EXCEEDED, result
    assert result.limits.memory_mb == 512
