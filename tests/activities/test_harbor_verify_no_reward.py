"""The verify activity on a Harbor script that exits without a reward, with real bwrap and a real
SeaweedFS: a missing interpreter (exit 127) scored every tree 0 and training went on with groups
of zeros; it is now the task's non-retryable InvalidTask naming the task and tests/test.sh, once
the untouched tree does the same. An agent's code that kills the script before it writes a
reward scores its tree 0 and fails nothing: the untouched tree leaves one."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.environment import EnvironmentActivities
from contracts.episode import VerifyItem, VerifyRequest
from contracts.errors import ErrorType
from contracts.sandbox import ExecutionResult
from contracts.task import EnvName, SandboxLimits, WorkspaceSpec
from infra.environments.tree import Check, Packed, pack_files
from infra.storage import ObjectStore
from tests.activities.environment_rig import environment_activities
from tests.infra.environments.conftest import needs_root

pytestmark = [needs_root, pytest.mark.asyncio]
LIMITS = SandboxLimits(timeout_s=20)
REWARD = "/logs/verifier/reward.txt"


@pytest_asyncio.fixture
async def acts(store: ObjectStore) -> AsyncIterator[EnvironmentActivities]:
    async with environment_activities(store, "sandbox-no-reward") as activities:
        yield activities


def stored(store: ObjectStore, packed: Packed) -> Packed:
    for key, data in packed.objects.items():
        store.put_bytes(key, data)
    return packed


def request(store: ObjectStore, test: str, final: dict[str, str]) -> VerifyRequest:
    """Verify the tree `final` (sample 0) of a task whose calc.py is harmless and whose
    tests/test.sh is `test`."""
    files = stored(store, pack_files({"calc.py": "print('untouched')\n"}))
    hidden = stored(store, pack_files({"test.sh": test}, Check(kind="script")))
    tree = stored(store, pack_files(final))
    return VerifyRequest(
        run_id="run-no-reward", task_id="harbor-no-reward", env=EnvName.WORKSPACE,
        workspace=WorkspaceSpec(files=files.ref, verifier=hidden.ref), limits=LIMITS,
        items=[VerifyItem(sample=0, snapshot=tree.ref)],
    )  # fmt: skip


async def test_a_script_whose_interpreter_is_missing_is_the_tasks_fault(
    acts: EnvironmentActivities, store: ObjectStore
) -> None:
    test = f"#!/usr/bin/env python3.99\nopen({REWARD!r}, 'w').write('1')\n"
    verify = request(store, test, {"calc.py": "print('the agent')\n"})
    with pytest.raises(ApplicationError) as raised:
        await ActivityEnvironment().run(acts.verify_episodes, verify)
    assert raised.value.type == ErrorType.INVALID_TASK and raised.value.non_retryable
    assert "task harbor-no-reward: tests/test.sh exited 127" in str(raised.value), raised.value


async def test_code_that_kills_the_script_before_its_reward_scores_zero(
    acts: EnvironmentActivities, store: ObjectStore
) -> None:
    test = f"python3 /app/calc.py\necho 1 > {REWARD}\n"
    killer = "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
    verify = request(store, test, {"calc.py": killer})
    (verdict,) = (await ActivityEnvironment().run(acts.verify_episodes, verify)).verdicts
    assert verdict.score == 0.0, verdict
    detail = store.get_model(verdict.result.key, ExecutionResult).detail
    assert detail.startswith("scored 0: tests/test.sh exited 137"), detail
