"""`infra.sandbox.workspace_deadline`: how much of a Harbor check's wall time was the host's.

Most tests script the looks of `CpuWaits.sample` at real sleeping processes (their /proc
states, a real SIGSTOP): the clock, the group's CPU pressure and each thread's wait come from
the test (recorded on a starved 2-CPU host), so the accounting is checked exactly, on any host.
- A thread the host starves: the kernel's "some" pressure averages each CPU's stall by the
  group's time on it, so a thread that migrates is averaged down (1.6 s of 3 s where the thread
  itself waited 2.4 s); its own wait counts, and no crowd of siblings inflates it.
- A run stopped once (a job-control test) still has its later waits counted: stopped time is
  never a wait, so the stop needs no rule of its own.
- No pressure group is made outside a cgroup2 mount.
Real starvation (outside spinners) is the slow test's; the verdicts on real bwrap runs are
tests/infra/environments/test_workspace_verifier_stops.py's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from contracts.task import SandboxLimits
from infra.sandbox import workspace_deadline
from infra.sandbox.cgroups import Cgroups, run_delay
from infra.sandbox.judge import deadline_state
from infra.sandbox.workspace_deadline import UNIFIED, CpuWaits, pressure_group

LIMITS = SandboxLimits(timeout_s=2, cpu_s=60, max_processes=64)
SLEEPERS = "import threading, time\n" + "threading.Thread(target=time.sleep, args=(60,)).start()\n"
SPIN = "import time\nend = time.monotonic() + 10\nwhile time.monotonic() < end:\n    pass\n"
UNDERCOUNTED = [(1.16, 0.78, 1.06), (2.40, 1.56, 2.35), (3.54, 2.17, 3.26), (4.64, 2.80, 4.19),
                (5.69, 3.47, 5.08)]  # fmt: skip
"""(seconds since the run began, its group's "some" stall, its one thread's wait) at each look,
as recorded of a spinner on a 2-CPU host that two spinners outside its group starved."""


class Scripted:
    """`CpuWaits` over a real process whose looks the test scripts: the clock, the group's
    stall (None: no pressure group) and each of its threads' waits (by thread id)."""

    def __init__(self, process: subprocess.Popen[bytes], pressure: bool, mp: pytest.MonkeyPatch):
        self.process, self.now, self.stall = process, 0.0, 0.0
        self.tids = sorted(int(tid) for tid in os.listdir(f"/proc/{process.pid}/task"))
        self.delays = dict.fromkeys(self.tids, 0.0)
        mp.setattr(workspace_deadline, "time", SimpleNamespace(monotonic=lambda: self.now))
        mp.setattr(workspace_deadline, "run_delay", lambda tid: self.delays.get(tid, 0.0))
        mp.setattr(workspace_deadline, "stalled", lambda group: self.stall)
        mp.setattr(
            workspace_deadline, "pressure_group", lambda name: Path("/") if pressure else None
        )
        cgroups = SimpleNamespace(name="scripted", pids=lambda: [process.pid], cpu_used=lambda: 0.0)
        self.waits = CpuWaits(cgroups)  # type: ignore[arg-type]

    def look(self, at: float, stall: float, *delays: float) -> tuple[float, float] | None:
        self.now, self.stall = at, stall
        self.delays.update(zip(self.tids, delays, strict=False))
        return self.waits.sample()


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """The processes a test starts, killed and reaped after it whatever it did."""
    processes: list[subprocess.Popen[bytes]] = []
    try:
        yield processes
    finally:
        for process in processes:
            process.kill()
            process.wait()


def sleeping(started: list[subprocess.Popen[bytes]], threads: int) -> subprocess.Popen[bytes]:
    """A process of `threads` sleeping threads, once they all are there."""
    argv = ["sleep", "60"] if threads == 1 else [sys.executable, "-c", SLEEPERS * (threads - 1)]
    process = subprocess.Popen(argv)
    started.append(process)
    for _ in range(1000):
        if len(os.listdir(f"/proc/{process.pid}/task")) == threads:
            return process
        time.sleep(0.01)
    raise AssertionError(f"{threads} threads never ran")


def state_becomes(pid: int, state: str) -> None:
    for _ in range(1000):
        if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == state:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never reached state {state}")


def test_a_thread_the_host_starves_counts_its_own_wait_where_pressure_undercounts_it(
    started: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the pressure alone counted (3.47 s of 5.69): a timeout at 5.7 s of wall time,
    the host's starvation scored 0 long before `starvation_bound`."""
    run = Scripted(sleeping(started, 1), True, monkeypatch)
    samples = [run.look(*look) for look in UNDERCOUNTED]
    assert samples[-1] is not None
    # Each interval counts the thread's wait, at most the interval (1.29 s of 1.24 s, once).
    assert samples[-1][0] == pytest.approx(1.06 + 1.24 + 0.91 + 0.93 + 0.89)
    assert deadline_state(5.69, samples[-1], LIMITS) == "running"


def test_a_crowd_of_threads_counts_its_largest_single_wait_not_their_sum(
    started: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Siblings that each wait for the CPUs the others hold add up to more than the wall time
    (before pressure: a sleep after a burst excused); one thread's wait never can."""
    run = Scripted(sleeping(started, 4), True, monkeypatch)
    for look in range(1, 5):
        sample = run.look(look * 0.25, look * 0.05, *[look * 0.2, look * 0.1, look * 0.1, 0])
    assert sample is not None
    assert sample[0] == pytest.approx(4 * 0.2)  # pressure 0.2, the sum 1.6, the wall time 1.0


def test_a_crowd_without_pressure_counts_at_most_the_wall_time(
    started: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Scripted(sleeping(started, 4), False, monkeypatch)
    for look in range(1, 5):
        sample = run.look(look * 0.25, 0.0, *[look * 0.2, look * 0.1, look * 0.1, 0])
    assert sample is not None
    assert sample[0] == pytest.approx(4 * 0.25)


def test_a_run_stopped_once_has_its_later_waits_counted(
    started: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test.sh that stops its own child and continues it (job control under test), then the
    host starves it: before, any stop seen had the wall clock count for the rest of the run,
    so the host's starvation was scored 0 as a timeout."""
    run = Scripted(process := sleeping(started, 1), True, monkeypatch)
    assert run.look(0.25, 0.0, 0.0) is not None
    os.kill(process.pid, signal.SIGSTOP)
    state_becomes(process.pid, "T")
    stopped = run.look(0.5, 0.0, 0.0)
    assert stopped is not None, run.waits.gave_away
    assert stopped[0] == 0.0  # stopped time is no wait
    os.kill(process.pid, signal.SIGCONT)
    state_becomes(process.pid, "S")
    after = run.look(3.5, 2.9, 2.9)  # 3 s later, 2.9 of them waiting for a CPU
    assert after is not None, run.waits.gave_away
    assert after[0] == pytest.approx(2.9)
    assert deadline_state(3.5, after, LIMITS) == "running"


@pytest.mark.parametrize("exists", [False, True], ids=["missing", "a plain directory"])
def test_no_pressure_group_is_made_outside_a_cgroup2_mount(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exists: bool
) -> None:
    """Before, `unified/tempered/<name>` was made wherever `unified` was (a tmpfs directory
    on a host with no unified hierarchy), and only the last of them removed."""
    unified = tmp_path / "unified"
    if exists:
        unified.mkdir()
    monkeypatch.setattr(workspace_deadline, "UNIFIED", unified)
    assert pressure_group("run") is None
    assert list(tmp_path.rglob("*")) == ([unified] if exists else [])


@pytest.mark.skipif(
    os.geteuid() != 0 or not (UNIFIED / "cpu.pressure").exists(),
    reason="needs root and a unified cgroup2 hierarchy with CPU pressure",
)
def test_a_pressure_group_is_made_on_the_unified_cgroup2_mount() -> None:
    group = pressure_group(f"{os.getpid()}-deadline-test")
    assert group is not None and (group / "cpu.pressure").exists()
    group.rmdir()


@pytest.mark.slow
@pytest.mark.skipif(
    os.geteuid() != 0 or not (UNIFIED / "cpu.pressure").exists(),
    reason="needs root, cgroups and a unified cgroup2 hierarchy with CPU pressure",
)
def test_a_spinner_the_host_starves_waits_no_less_than_its_own_schedstat() -> None:
    """Real starvation: a run's one spinning thread beside as many spinners outside its groups
    as this host has CPUs, for 3 s. Where the kernel's pressure undercounts the thread's wait
    (it did on a 2-CPU host, every time), the thread's own wait still counts."""
    spin = [sys.executable, "-c", SPIN]  # one process that ends by itself, whatever happens
    load = [subprocess.Popen(spin) for _ in range(os.cpu_count() or 1)]
    cgroups = Cgroups.create(f"{os.getpid()}-deadline-test")
    waits = CpuWaits(cgroups)
    joins = " && ".join(f"echo $$ > {path}" for path in cgroups.procs_files() + waits.procs_files())
    run = subprocess.Popen(["sh", "-c", f'{joins} && exec "$@"', "sh", *spin])
    try:
        time.sleep(0.1)
        assert waits.sample() is not None
        for _ in range(12):
            time.sleep(0.25)
            sample = waits.sample()
        own = run_delay(run.pid)
        assert sample is not None
        assert sample[0] >= own - 0.1, (sample, own)
    finally:
        for process in [run, *load]:
            process.kill()
            process.wait()
        cgroups.reap_blocking()
        waits.close()
