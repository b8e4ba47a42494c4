"""A Harbor check's `[verifier] timeout_sec` is its deadline, shorter than the run's limit too.

`check_limits` took the larger of the run's sandbox limit and the task's timeout, so a task
that gives its test 2 s ran it for the run's 10 s: a solution too slow for the task scored 1.
The task's timeout (Harbor's 600 s where task.toml names none) is the deadline and the CPU
limit; the run's limits count only for a check that states none (the functions kind's).
"""

from __future__ import annotations

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.environments.checks import check_limits
from infra.environments.tree import Check
from tests.infra.environments.conftest import Rig, needs_root

REWARD = "/logs/verifier/reward.txt"


@pytest.mark.parametrize(
    ("stated", "run", "timeout", "cpu"),
    [
        (2.0, SandboxLimits(cpu_s=60), 2.0, 60),  # never less CPU than the run allows
        (600.0, SandboxLimits(timeout_s=60, cpu_s=2400), 600.0, 2400),  # was cut at 600
        (2.5, SandboxLimits(), 2.5, 10),
        (600.0, SandboxLimits(), 600.0, 600),
        (None, SandboxLimits(cpu_s=7), 10.0, 10),  # none stated: the run's, CPU at least its wall
        (None, SandboxLimits(timeout_s=3, cpu_s=60), 3.0, 60),
    ],
)
def test_the_checks_timeout_is_its_deadline_and_least_cpu_limit(
    stated: float | None, run: SandboxLimits, timeout: float, cpu: int
) -> None:
    limits = check_limits(Check(kind="script", timeout_s=stated), run.model_copy())
    assert (limits.timeout_s, limits.cpu_s) == (timeout, cpu)
    assert limits.memory_mb == run.memory_mb


@needs_root
@pytest.mark.asyncio
async def test_a_test_slower_than_the_tasks_timeout_times_out(rig: Rig) -> None:
    check = Check(kind="script", timeout_s=2.0)
    spec = rig.spec({"a.txt": "a\n"}, {"test.sh": f"sleep 5\necho 1 > {REWARD}\n"}, check)
    graded = await rig.env.verify(spec, await rig.env.reset(spec, "s0"), SandboxLimits())
    assert graded.score == 0.0 and graded.result.status is ExecStatus.TIMEOUT, graded.result
    assert graded.result.limits.timeout_s == 2.0  # not the sleep's 5 s: no duration bound, as a
    # host that kept the check waiting for a CPU does not count (workspace_deadline.py)
