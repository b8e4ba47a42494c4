"""Harbor trees too large for the scratch they are restored into, with real bwrap, a real
tmpfs and a real SeaweedFS: tests/ that do not fit the verifier's scratch once failed the
training run as InvalidInput blaming the agent's snapshot, and a solution that did not fit
the solve's scratch raised a bare OSError; each is the task's fault (InvalidTask), naming it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.environment import EnvironmentActivities
from contracts.episode import VerifyItem, VerifyRequest
from contracts.errors import ErrorType
from contracts.task import EnvName, SandboxLimits, WorkspaceSpec
from infra.environments.checks import InvalidTask
from infra.environments.tree import Check, Packed, pack_files
from infra.storage import ObjectStore
from tests.activities.environment_rig import environment_activities
from tests.infra.environments.conftest import needs_root

pytestmark = [needs_root, pytest.mark.asyncio]
LIMITS = SandboxLimits(timeout_s=8)
BIG = os.urandom(2 << 20)
"""2 MB: more than the 1 MB workspace (and scratch) these activities have."""


@pytest_asyncio.fixture
async def acts(store: ObjectStore) -> AsyncIterator[EnvironmentActivities]:
    async with environment_activities(store, "sandbox-review", max_workspace_mb=1) as activities:
        if not activities.host.tmpfs:
            pytest.skip("this worker cannot mount a tmpfs: no scratch has a size")
        yield activities


def stored(store: ObjectStore, packed: Packed) -> Packed:
    for key, data in packed.objects.items():
        store.put_bytes(key, data)
    return packed


def spec(store: ObjectStore, tests: dict[str, str | bytes]) -> WorkspaceSpec:
    files = stored(store, pack_files({"out.txt": "initial\n"}))
    hidden = stored(store, pack_files(tests, Check(kind="script")))
    return WorkspaceSpec(files=files.ref, verifier=hidden.ref)


async def test_tests_that_do_not_fit_the_verifiers_scratch_are_the_tasks_fault(
    acts: EnvironmentActivities, store: ObjectStore
) -> None:
    workspace = spec(store, {"test.sh": "echo 1 > /logs/verifier/reward.txt\n", "big.bin": BIG})
    final = stored(store, pack_files({"out.txt": "the agent's\n"}))
    verify = VerifyRequest(
        run_id="run-review", task_id="big-tests", env=EnvName.WORKSPACE, workspace=workspace,
        limits=LIMITS, items=[VerifyItem(sample=0, snapshot=final.ref)],
    )  # fmt: skip
    with pytest.raises(ApplicationError) as raised:
        await ActivityEnvironment().run(acts.verify_episodes, verify)
    assert raised.value.type == ErrorType.INVALID_TASK and raised.value.non_retryable
    assert "task big-tests: tests/ " in str(raised.value), raised.value
    assert "snapshot" not in str(raised.value)


async def test_a_solution_that_does_not_fit_its_scratch_is_the_tasks_fault(
    acts: EnvironmentActivities, store: ObjectStore
) -> None:
    workspace = spec(store, {"test.sh": "echo 1 > /logs/verifier/reward.txt\n"})
    solution = stored(store, pack_files({"solve.sh": "true\n", "big.bin": BIG}))
    state = await acts.env.reset(workspace, "s0")
    with pytest.raises(InvalidTask, match=r"solution/ .*1 MB"):
        await acts.env.solve(state, solution.ref, LIMITS)
