"""Whose fault a passed deadline is when CPUs are busy, on real bwrap, zygotes and cgroups: the
host's (the run a platform fault, retried) or the program's (a timeout, scored).

- A program that gives its own CPU away (its nice, its session's autogroup nice, SCHED_IDLE,
  fewer CPUs) gets no starvation excuse: the wall clock counts, so beside a busy CPU its
  deadline is its timeout, not the host's starvation retried for ever (`Cgroups.cpu_wait`).
- The checker's wait for a CPU is the host's as well: while the checker runs the tests the
  candidate sleeps on its pipe, so a correct program whose checker the host starved is not a
  timeout (`judge.deadline_state`).

Both run on gVisor too (its candidate's wait is its sandbox threads'), where it runs here.

Load: one busy process pinned to CPU 0 for a couple of seconds, in its own session (so it
shares CPU 0 fairly with the sandboxes' sessions); the checker's starvation is a cpu cgroup's
quota instead (no load at all).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox.cgroups import Cgroups
from infra.sandbox.judge import starvation_bound
from tests.infra.sandbox.attacks import BLOCKING_AND_FLOODING, TESTS
from tests.infra.sandbox.test_infra_faults import CGROUP_V1, cgroup, writable
from tests.infra.sandbox.verifier_box import Box, gvisor_missing, needs_root

pytestmark = needs_root
LIMITS = SandboxLimits(timeout_s=2)
BUSY = "import os\nos.sched_setaffinity(0, {0})\n"
SPIN = "while True:\n    pass\n"
GIVES_ITS_CPU_AWAY = BLOCKING_AND_FLOODING["give its CPU away to fake the host's starvation"]
SPINS_BESIDE_A_BUSY_CPU = "def add(a, b):\n    while True:\n        pass\n"
ADD = "def add(a, b):\n    return a + b\n"
CHECKER_WORK = (  # 0.2-0.5 s of the checker's CPU on an idle host, the program's next to none
    "def check(candidate):\n"
    "    total = sum(i * i for i in range(6_000_000))\n"
    "    assert candidate(total, 1) == total + 1\n"
)
LOWERINGS = {  # how a process gives its CPU away, and how it takes back what the kernel lets it
    "its autogroup's nice": (  # a with block: a write the kernel refuses raises at close
        "with open('/proc/self/autogroup', 'w') as f: f.write('19')",
        "with open('/proc/self/autogroup', 'w') as f: f.write('0')",
    ),
    "its nice": ("os.nice(19)", "os.nice(-19)"),
    "SCHED_IDLE": (
        "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))",
        "os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))",
    ),
    "one CPU of several": (
        "every = os.sched_getaffinity(0); os.sched_setaffinity(0, {min(every)})",
        "os.sched_setaffinity(0, every)",
    ),
    "nothing (the control)": ("pass", "pass"),
}
PID_1 = (  # pid 1 of its own pid namespace and session, as a candidate is; steps on the host's word
    "import os, sys, time\n{lower}\nprint('lowered', flush=True)\nsys.stdin.readline()\n"
    "{restore}\nprint('restored', flush=True)\ntime.sleep(60)\n"
)


@contextlib.contextmanager
def busy_cpu0(count: int, first: str = "") -> Iterator[None]:
    """`count` processes spinning on CPU 0, each in its own session, each running `first`."""
    code = BUSY + first + SPIN
    hogs = [
        subprocess.Popen([sys.executable, "-c", code], start_new_session=True) for _ in range(count)
    ]
    try:
        time.sleep(0.2)
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


@pytest.mark.skipif(not Cgroups.available(), reason="needs writable cgroups v1")
@pytest.mark.parametrize(("lower", "restore"), LOWERINGS.values(), ids=LOWERINGS)
def test_a_pid_1_that_gives_its_cpu_away_gets_no_starvation_excuse(
    lower: str, restore: str
) -> None:
    """`cpu_wait` is None (the wall clock counts) once the run's pid 1 gave its CPU away, and
    stays so after it took back what it could (a sample between two polls must not clear it);
    the control's is its wait and CPU."""
    if "affinity" in lower and len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: nothing to narrow")
    if "nice" in lower and os.getpriority(os.PRIO_PROCESS, 0) >= 19:
        pytest.skip("pytest runs at nice 19: a candidate cannot claim less than the host")
    if "SCHED_IDLE" in lower and os.sched_getscheduler(0) == os.SCHED_IDLE:
        pytest.skip("pytest runs under SCHED_IDLE: a candidate cannot claim less than the host")
    code = PID_1.format(lower=lower, restore=restore)
    unshare = subprocess.Popen(
        ["unshare", "--pid", "--fork", sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own autogroup (pytest's may be the kernel's default one,
    )  # whose nice cannot be set: the write failed unseen and nothing was given away)
    cgroups = Cgroups.create(f"{os.getpid()}-starve-{uuid.uuid4().hex[:8]}")
    assert unshare.stdin is not None and unshare.stdout is not None
    try:
        assert unshare.stdout.readline() == "lowered\n"
        (pid_1,) = psutil.Process(unshare.pid).children()
        for procs in cgroups.procs_files():
            procs.write_text(str(pid_1.pid))
        first = cgroups.cpu_wait()
        unshare.stdin.write("go\n")
        unshare.stdin.flush()
        assert unshare.stdout.readline() == "restored\n"
        second = cgroups.cpu_wait()
        if lower == "pass":
            assert first is not None and second is not None
        else:
            assert first is None and second is None, (first, second)
    finally:
        unshare.kill()
        unshare.wait()
        cgroups.reap_blocking()


def test_a_program_that_gives_its_cpu_to_a_busy_one_is_a_timeout(any_box: Box) -> None:
    """Its autogroup niced to 19 on the CPU another session spins on, it waits for a CPU
    nearly all the time: that was taken for the host's starvation (SandboxInfraError after
    the 22 s bound, on every retry). It gave the CPU away itself: a timeout at its deadline.
    On gVisor it cannot give its sandbox's CPU away (what it does is its kernel's, not this
    host's) and spins beside the busy CPU: a timeout too, though its sandbox's threads wait."""
    gvisor = any_box.backend.name == "gvisor"
    program = SPINS_BESIDE_A_BUSY_CPU if gvisor else GIVES_ITS_CPU_AWAY
    with busy_cpu0(1, "with open('/proc/self/autogroup', 'w') as f: f.write('5')\n"):
        started = time.monotonic()
        result = any_box.run(program, TESTS, "add", limits=LIMITS)
    assert result.status is ExecStatus.TIMEOUT and result.tests_passed == 0, result
    # judged at its deadline, well before the starvation bound (22 s): 3.6 s on an idle host,
    # 10.03 s on gVisor at load 2.5 from other work (a 10 s bound failed there); a run whose own
    # wait was discounted in part would be judged later
    assert time.monotonic() - started < 15 < starvation_bound(LIMITS.timeout_s)


def throttle(zygote: psutil.Process, group: Path) -> None:
    """Move the checker's zygote and all its forks into `group`, until none is left outside: a
    child forked while the list was read stayed out, ran the tests at full speed, and the test
    saw the deadline not pass (1.94 s of 2 under load)."""
    for _ in range(20):
        outside = [
            process
            for process in [zygote, *zygote.children(recursive=True)]
            if _cpu_cgroup(process) != "/" + str(group.relative_to(CGROUP_V1 / "cpu"))
        ]
        if not outside:
            return
        for process in outside:
            with contextlib.suppress(ProcessLookupError):  # the last run's, dying
                (group / "cgroup.procs").write_text(str(process.pid))
    raise AssertionError(f"the checker's processes keep leaving {group}")


def _cpu_cgroup(process: psutil.Process) -> str:
    """The process's cgroup v1 `cpu` path ("" once it is gone)."""
    try:
        lines = Path(f"/proc/{process.pid}/cgroup").read_text().splitlines()
    except OSError:
        return ""
    fields = [line.split(":", 2) for line in lines]
    return next((path for _, names, path in fields if "cpu" in names.split(",")), "")


@pytest.mark.alone  # the judgement reads the CPU others take: failed twice beside other tests
@pytest.mark.skipif(bool(writable("cpu")), reason=str(writable("cpu")))
@pytest.mark.parametrize("backend", ["local", "gvisor"])
def test_a_correct_program_whose_checker_the_host_starves_is_not_a_timeout(backend: str) -> None:
    """The checker zygote throttled to 5% of a CPU (a cgroup of the test's, standing in for the
    worker's own overload): the checker runs the tests past the 2 s deadline while the
    candidate sleeps on its pipe (no wait of its own). That was the program's timeout; the
    checker's wait for a CPU is the host's: the program passes (the checker is the same on
    both backends)."""
    if backend == "gvisor" and (reason := gvisor_missing()):
        pytest.skip(reason)
    box = Box(backend, warm=0)
    with cgroup(CGROUP_V1 / "cpu", {"cpu.cfs_quota_us": "5000"}) as slow:
        try:
            assert box.run(ADD, CHECKER_WORK, "add", limits=LIMITS).status is ExecStatus.PASSED
            checker = box.verifier._checker
            assert checker is not None and checker.process is not None
            throttle(psutil.Process(checker.process.pid), slow)
            started = time.monotonic()
            result = box.run(ADD, CHECKER_WORK, "add", limits=LIMITS)
            took = time.monotonic() - started
        finally:
            box.close()  # the zygote leaves the test's cgroup before it is removed
    assert result.status is ExecStatus.PASSED, (result, took)
    assert took > LIMITS.timeout_s, took  # the deadline did pass on the wall clock
