"""A Harbor script check's deadline: Harbor's own default when task.toml names none, and the
rule of the functions kind (`judge.deadline_state`) for time the host kept it waiting.

- task.toml without `[verifier] timeout_sec`: Harbor gives test.sh 600 s; the run's sandbox
  limit (10 s by default) once scored a correct answer 0 because its test took 12 s.
- The host starves the check (a cgroup of the test's throttles the test's Python to 1% of a
  CPU, as in tests/infra/sandbox/test_infra_faults.py), so its wall-clock deadline passes while
  it was runnable but not run: a platform fault (SandboxInfraError, retried), never a score.
  It was scored 0 as a timeout.
- Controls, scored 0 as timeouts: a check whose own processes keep each other waiting (they
  used the CPU), and one that gave its CPU away itself (a nice) before the host throttled it.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.environments.checks import check_limits
from infra.sandbox import judge
from infra.sandbox.base import SandboxInfraError
from infra.tasks.harbor import load_task
from tests.infra.environments.conftest import Rig, needs_root
from tests.infra.sandbox.test_infra_faults import (
    CGROUP_V1,
    cgroup,
    mark,
    move_and_go,
    named,
    writable,
)
from tests.paths import REPO_ROOT

REWARD = "/logs/verifier/reward.txt"
WAITING = (  # a Python named `{mark}` that computes once SIGUSR1 comes, after `{before}`
    "python3 -c '\n"
    'open("/proc/self/comm", "w").write("{mark}")\n'
    "import os, signal\n"
    "{before}\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGUSR1}})\n"
    "signal.sigwait({{signal.SIGUSR1}})\n"
    "total = 0\n"
    "for i in range(3 * 10**7):\n"
    "    total += i\n"
    "'\n"
    f"echo 1 > {REWARD}\n"
)
NO_CPU = writable("cpu")


def test_a_task_toml_without_timeout_sec_gets_harbors_default(tmp_path: Path) -> None:
    directory = Path(shutil.copytree(REPO_ROOT / "examples/harbor/fix-greeting", tmp_path / "t"))
    (directory / "task.toml").write_text('version = "1.0"\n[metadata]\ndifficulty = "easy"\n')
    check = load_task(directory, suite="harbor:x").tests.manifest.check
    assert check is not None and check.timeout_s == 600.0
    assert check_limits(check, SandboxLimits()).timeout_s == 600.0


async def throttled_check(rig: Rig, before: str, limits: SandboxLimits) -> str:
    """Verify a check whose Python waits for SIGUSR1 (after running `before`), moved into a
    cgroup that gives it 1% of a CPU once it is there; its status, or "infra_error"."""
    name = mark()
    spec = rig.spec({"a.txt": "a\n"}, {"test.sh": WAITING.format(mark=name, before=before)})
    state = await rig.env.reset(spec, "s0")
    with cgroup(CGROUP_V1 / "cpu", {"cpu.cfs_quota_us": "1000"}) as slow:
        verify = asyncio.create_task(rig.env.verify(spec, state, limits))
        for _ in range(400):
            if found := named(name):
                await asyncio.sleep(0.3)  # let it reach sigwait
                assert not verify.done(), f"the check ended before the throttle: {verify}"
                move_and_go(slow)(found[0])
                break
            assert not verify.done(), f"the check ended before {name} appeared: {verify}"
            await asyncio.sleep(0.05)
        else:
            pytest.fail(f"no process named {name} appeared")
        try:
            graded = await asyncio.wait_for(verify, 120)
        except SandboxInfraError:
            return "infra_error"
    assert graded.score == 0.0
    return str(graded.result.status)


@needs_root
@pytest.mark.asyncio
@pytest.mark.skipif(bool(NO_CPU), reason=str(NO_CPU))
async def test_a_check_the_host_starves_is_a_platform_fault(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Starved, it waits out `judge.starvation_bound`: without its 20 s floor
    (`STARVATION_SLACK_S`), 3 x `timeout_s` more, 12 s instead of 23 s; the same rule."""
    monkeypatch.setattr(judge, "STARVATION_SLACK_S", 0.0)
    limits = SandboxLimits(timeout_s=3, cpu_s=60)
    assert await throttled_check(rig, "", limits) == "infra_error"


@needs_root
@pytest.mark.asyncio
@pytest.mark.skipif(bool(NO_CPU), reason=str(NO_CPU))
async def test_a_check_that_gave_its_cpu_away_times_out(rig: Rig) -> None:
    limits = SandboxLimits(timeout_s=2, cpu_s=60)
    assert await throttled_check(rig, "os.nice(5)", limits) == ExecStatus.TIMEOUT


@needs_root
@pytest.mark.asyncio
async def test_a_check_whose_own_processes_keep_it_waiting_times_out(rig: Rig) -> None:
    """Eight spinners on this host's CPUs: each waits for a CPU its siblings hold, and the
    check used the CPU, so the deadline is its own."""
    script = "for i in 1 2 3 4 5 6 7 8; do (while :; do :; done) & done\nwait\n"
    spec = rig.spec({"a.txt": "a\n"}, {"test.sh": script})
    state = await rig.env.reset(spec, "s0")
    graded = await rig.env.verify(spec, state, SandboxLimits(timeout_s=1.5, cpu_s=60))
    assert graded.score == 0.0 and graded.result.status is ExecStatus.TIMEOUT, graded.result
