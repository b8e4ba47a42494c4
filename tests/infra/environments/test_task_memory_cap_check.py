"""The one rule of a task's memory (`WorkspaceSpec.limits_of`): the task's stated memory, at
most the operator's cap (`sandbox.workspaces.max_task_memory_mb`), which never lowers it below
the run's own limit; and a check given limits already capped never raises them again to the
task's ask (it did: `check_script` put the task's 8192 MB back over the worker's cap), on real
bwrap."""

from __future__ import annotations

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits, WorkspaceSpec
from infra.settings import WorkspaceSettings
from tests.infra.environments.conftest import Rig, needs_root

RUN = SandboxLimits(timeout_s=30)  # memory_mb: 512
REWARD = "/logs/verifier/reward.txt"


@pytest.mark.parametrize(
    ("stated", "cap", "mb"),
    [
        (8192, 4096, 4096),  # capped
        (4096, 4096, 4096),
        (1024, 4096, 1024),  # within the cap: the task's
        (64, 4096, 64),  # less than the run's: the task's, as before
        (8192, 256, 512),  # a cap below the run's limit never lowers a task below it
        (None, 256, 512),  # none stated: the run's
    ],
)
def test_the_tasks_memory_is_at_most_the_cap(stated: int | None, cap: int, mb: int) -> None:
    ref = {"key": "t", "size": 0, "sha256": "0" * 64}
    spec = WorkspaceSpec.model_validate({"files": ref, "verifier": ref, "memory_mb": stated})
    limits = spec.limits_of(RUN, cap)
    assert limits.memory_mb == mb
    assert limits.model_dump(exclude={"memory_mb"}) == RUN.model_dump(exclude={"memory_mb"})
    assert spec.limits_of(limits, cap) == limits  # applied twice: the same


def test_the_cap_setting_has_bounds_and_a_default() -> None:
    assert WorkspaceSettings().max_task_memory_mb == 4096
    assert WorkspaceSettings(max_task_memory_mb=16).max_task_memory_mb == 16
    for wrong in (15, 65537):
        with pytest.raises(ValueError, match="max_task_memory_mb"):
            WorkspaceSettings(max_task_memory_mb=wrong)


@needs_root
@pytest.mark.asyncio
async def test_a_check_given_capped_limits_stays_within_them(rig: Rig) -> None:
    allocate = "python3 -c 'b = b\"x\" * (1200 << 20)'"
    tests = {"test.sh": f"#!/bin/bash\n{allocate} && echo 1 > {REWARD}\n"}
    spec = rig.spec({"a.txt": "a\n"}, tests, memory_mb=8192)
    capped = RUN.model_copy(update={"memory_mb": 1024})  # what the activity gives it
    graded = await rig.env.verify(spec, await rig.env.reset(spec, "s0"), capped)
    assert graded.result.limits.memory_mb == 1024, graded.result
    assert graded.result.status is ExecStatus.MEMORY_EXCEEDED and graded.score == 0.0
