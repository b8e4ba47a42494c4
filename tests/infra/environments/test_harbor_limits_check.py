"""A task's stated memory (`WorkspaceSpec.memory_mb`, Harbor's `[environment] memory_mb`) is its
check's memory limit wherever the check runs, raised (within the operator's cap: the caller's
`limits_of(run, cap)`) or lowered from the run's, on real bwrap. Only the memory changes: the
check's timeout stays its own (`check_limits`)."""

from __future__ import annotations

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import MAX_MEMORY_MB, SandboxLimits, WorkspaceSpec
from infra.environments.checks import check_limits
from infra.environments.tree import Check
from tests.infra.environments.conftest import Rig, needs_root

REWARD = "/logs/verifier/reward.txt"
RUN = SandboxLimits(timeout_s=30)  # memory_mb: 512


def allocating(mb: int) -> dict[str, str]:
    """A test script that writes a reward of 1 once it has `mb` MB (every page written)."""
    allocate = f"python3 -c 'b = b\"x\" * ({mb} << 20)'"
    return {"test.sh": f"#!/bin/bash\n{allocate} && echo 1 > {REWARD}\n"}


@pytest.mark.parametrize(("stated", "mb"), [(None, 512), (1024, 1024), (64, 64), (65536, 65536)])
def test_the_stated_memory_replaces_the_runs_and_nothing_else(stated: int | None, mb: int) -> None:
    ref = {"key": "t", "size": 0, "sha256": "0" * 64}
    spec = WorkspaceSpec.model_validate({"files": ref, "verifier": ref, "memory_mb": stated})
    limits = spec.limits_of(RUN, MAX_MEMORY_MB)
    assert limits.memory_mb == mb
    assert limits.model_dump(exclude={"memory_mb"}) == RUN.model_dump(exclude={"memory_mb"})
    checked = check_limits(Check(kind="script", timeout_s=5.0), limits)
    assert (checked.memory_mb, checked.timeout_s) == (mb, 5.0)


@needs_root
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("stated", "mb", "status"),
    [
        (1024, 700, ExecStatus.PASSED),  # raised: 700 MB within the task's 1024
        (None, 700, ExecStatus.MEMORY_EXCEEDED),  # the run's 512
        (64, 200, ExecStatus.MEMORY_EXCEEDED),  # lowered: 200 MB past the task's 64
    ],
    ids=["raised", "the-runs", "lowered"],
)
async def test_the_check_runs_within_the_tasks_memory_given_capped_limits(
    rig: Rig, stated: int | None, mb: int, status: ExecStatus
) -> None:
    spec = rig.spec({"a.txt": "a\n"}, allocating(mb), memory_mb=stated)
    limits = spec.limits_of(RUN, 4096)  # as the activity and validate pass them
    graded = await rig.env.verify(spec, await rig.env.reset(spec, "s0"), limits)
    assert graded.result.status is status, graded.result
    assert graded.score == (1.0 if status is ExecStatus.PASSED else 0.0)
    assert graded.result.limits.memory_mb == (stated or RUN.memory_mb)


@needs_root
@pytest.mark.asyncio
async def test_given_the_runs_own_limits_the_check_never_raises_them(rig: Rig) -> None:
    """A caller that passes the run's limits as they are (no cap applied: no caller does) gets
    them lowered to a smaller ask, never raised: the worker's cap is the caller's to apply."""
    spec = rig.spec({"a.txt": "a\n"}, allocating(16), memory_mb=1024)
    graded = await rig.env.verify(spec, await rig.env.reset(spec, "s0"), RUN)
    assert graded.result.limits.memory_mb == RUN.memory_mb, graded.result
