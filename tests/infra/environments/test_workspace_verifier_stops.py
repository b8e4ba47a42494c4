"""Attacks on a Harbor script check's deadline by the agent's code, on real bwrap and cgroups.

The check's test.sh runs the workspace's code (as Harbor does), in the sandbox's one pid
namespace and uid, so that code can SIGSTOP test.sh: it must score 0 as a timeout, never a
platform fault (retried: a wrong answer would earn endless retries, or an episode skipped).

- Stopped after a burst: forty processes spin for a moment, each waiting for CPUs its siblings
  hold, so the waits of all their threads add up to far more than the wall time the run lost;
  then the code stops test.sh. Counted as a sum, those waits excused the stopped time until
  the starvation bound passed, and the run was the host's starvation (SandboxInfraError). Now
  each look counts at most the wall time since the last, and a stopped thread waits for no CPU:
  a timeout at its deadline and the burst's wall time, long before the starvation bound.
- Idle after a burst: the same burst, then a sleep (no stop): the sum excused the sleep too;
  with the kernel's CPU pressure of the run, and without it.
- Stopped without a burst: a timeout at its deadline, not at the starvation bound.
- A process an agent's step leaves behind to stop the check later: none outlives its step (no
  process of the session's uid is left), with the step's pid namespace and cgroups, and with
  either alone; the check runs and passes.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import psutil
import pytest

from contracts.episode import ToolCall
from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox import workspace_deadline
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.judge import starvation_bound
from infra.sandbox.workspace import CommandRunner
from tests.infra.environments.conftest import Rig, needs_root

pytestmark = needs_root
LIMITS = SandboxLimits(timeout_s=3, cpu_s=60, max_processes=64)
STOP = "import os, signal, time\nos.kill(os.getppid(), signal.SIGSTOP)\n"
BURST = (  # forty processes that spin for 0.75 s side by side, then `after` in the parent
    "import os, signal, time\n"
    "children = []\n"
    "for _ in range(40):\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        end = time.monotonic() + 0.75\n"
    "        while time.monotonic() < end:\n"
    "            pass\n"
    "        os._exit(0)\n"
    "    children.append(pid)\n"
    "for pid in children:\n"
    "    os.waitpid(pid, 0)\n"
    "{after}\n"
)
TEST_SH = "python3 solution.py\necho 0 > /logs/verifier/reward.txt\n"


async def verified(rig: Rig, solution: str) -> tuple[str, float, str]:
    """(status, score, detail) of a check whose test.sh runs `solution`, or ("infra_error",
    seconds it took, the fault)."""
    spec = rig.spec({"solution.py": solution}, {"test.sh": TEST_SH})
    state = await rig.env.reset(spec, "s0")
    started = time.monotonic()
    try:
        graded = await rig.env.verify(spec, state, LIMITS)
    except SandboxInfraError as exc:  # retried, never a score
        return "infra_error", time.monotonic() - started, f"{type(exc).__name__}: {exc}"
    return str(graded.result.status), graded.score, graded.result.detail


@pytest.mark.asyncio
async def test_a_check_its_code_stops_after_a_burst_scores_a_timeout(rig: Rig) -> None:
    started = time.monotonic()
    status, score, detail = await verified(rig, BURST.format(after=STOP))
    assert (status, score) == (ExecStatus.TIMEOUT, 0.0), detail
    assert time.monotonic() - started < starvation_bound(LIMITS.timeout_s) / 2, detail


@pytest.mark.asyncio
@pytest.mark.parametrize("pressure", [True, False], ids=["pressure", "no pressure"])
async def test_a_check_its_code_leaves_idle_after_a_burst_scores_a_timeout(
    rig: Rig, pressure: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the kernel's CPU pressure of the run, and without it (the threads' waits, at most
    the wall time between two looks)."""
    if not pressure:
        monkeypatch.setattr(workspace_deadline, "pressure_group", lambda name: None)
    status, score, detail = await verified(rig, BURST.format(after="time.sleep(3600)"))
    assert (status, score) == (ExecStatus.TIMEOUT, 0.0), detail


@pytest.mark.asyncio
async def test_a_check_its_code_stops_is_a_timeout_at_its_deadline(rig: Rig) -> None:
    """No burst: the stopped time is the run's own, so it ends at its deadline, not the
    starvation bound's."""
    started = time.monotonic()
    status, score, detail = await verified(rig, STOP)
    assert (status, score) == (ExecStatus.TIMEOUT, 0.0), detail
    assert time.monotonic() - started < starvation_bound(LIMITS.timeout_s) / 2, detail


def without_pid_namespace(runner: CommandRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's sandboxes share the host's pid namespace (every other namespace kept)."""
    argv = runner.argv

    def shared_pids(*args: Any, **kwargs: Any) -> list[str]:
        line = argv(*args, **kwargs)
        unshare = ["--unshare-user", "--unshare-ipc", "--unshare-net", "--unshare-uts"]
        at = line.index("--unshare-all")
        line[at : at + 1] = [*unshare, "--unshare-cgroup-try"]
        line.remove("--as-pid-1")
        return line

    monkeypatch.setattr(runner, "argv", shared_pids)


def survivors(uid: int) -> list[psutil.Process]:
    """Live processes of `uid`, after a moment for the killed ones to die."""
    deadline = time.monotonic() + 2
    while True:
        left = [
            proc
            for proc in psutil.process_iter(["uids", "status", "cmdline"])
            if proc.info["uids"] is not None
            and proc.info["uids"].real == uid
            and proc.info["status"] != psutil.STATUS_ZOMBIE
        ]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


@pytest.mark.asyncio
@pytest.mark.parametrize("defences", ["both", "pid namespace alone", "cgroups alone"])
async def test_a_process_an_agents_step_leaves_cannot_stop_the_check(
    rig: Rig, defences: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each defence holds by itself: the step's pid namespace (its pid 1 exits, the kernel
    kills the rest) and the reap of its cgroups. A survivor would run as the session's uid."""
    if defences == "pid namespace alone":
        monkeypatch.setattr(rig.env.runner, "use_cgroups", False)
    elif defences == "cgroups alone":
        if not rig.env.runner.use_cgroups:
            pytest.skip("no cgroups on this host")
        without_pid_namespace(rig.env.runner, monkeypatch)
    test_sh = "sleep 1.5\necho 1 > /logs/verifier/reward.txt\n"
    spec = rig.spec({"a.txt": "a\n"}, {"test.sh": test_sh})
    state = await rig.env.reset(spec, "s0")
    stopper = (  # tries every way a leftover could reach the check: by name and every pid
        '(setsid sh -c \'trap "" HUP TERM; echo up > .stopper; sleep 1; while :; do '
        "pkill -STOP -f test.sh; kill -STOP -1; sleep 0.05; done' > /dev/null 2>&1 < /dev/null &)"
        "; while [ ! -e .stopper ]; do sleep 0.02; done; echo left"  # it started
    )
    call = ToolCall(name="bash", arguments={"command": stopper})
    state, seen = await rig.env.step(state, call, LIMITS)
    assert "left" in seen.text, seen.text
    left = survivors(rig.host.sessions["s0"].uid)
    found = [proc.info for proc in left]
    for proc in left:  # not to stay on the host after a failure
        with contextlib.suppress(psutil.Error):
            proc.kill()
    assert not found, found
    started = time.monotonic()
    graded = await rig.env.verify(spec, state, LIMITS)
    assert graded.score == 1.0, graded.result
    assert time.monotonic() - started < starvation_bound(LIMITS.timeout_s)
