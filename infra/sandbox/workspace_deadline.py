"""When a workspace command's deadline has passed: wall time, or the command's own time.

    waits = CpuWaits(cgroups)                         # a verifier's script (`own_time`)
    ... the launching shell joins `waits.procs_files()` beside the run's cgroups ...
    deadline = await wait_out(process, limits, waits)  # "" (it exited) | "timeout" | "starved"
    waits.close()                                     # once the run's processes are gone

An agent's step gets wall time (`waits` None). A Harbor check's script, whose timeout is a
score of 0, gets the functions check's rule (`judge.deadline_state`, its one home): it has had
its time once it used `limits.timeout_s` of the wall clock, not counting the time it spent
runnable but waiting for a CPU, unless it burnt that much CPU; "starved" when the host never
gave it that time within `judge.starvation_bound` (a platform fault, for the caller to raise).

The time a script waited is wall time in which at least one of its threads was runnable but
not run. Between two looks it counts the larger of two measures, at most the wall time between
them (`CpuWaits.look`): the kernel's CPU pressure ("some", `cpu.pressure`) of a cgroup v2 group
of its own (`pressure_group`: on a host with cgroup v1's controllers, the unified hierarchy
beside them, where that is a cgroup2 mount), which the launching shell joins, so every process
of the run is born in it; and the largest wait one thread added (its schedstat `run_delay`).
The kernel averages each CPU's stall by the group's time on that CPU, so a thread that migrates
is averaged down (a spinner that waited 2.4 s of 3 s: 1.6 s of pressure, and the host's
starvation scored 0 as a timeout); one thread's wait is exact for itself. Neither grows with a
crowd: added up, the waits of forty processes that spun side by side for 0.75 s (each waiting
for CPUs its siblings held) came to 26.6 s, and excused 26 s of a sleep or a SIGSTOP after
them, so a wrong answer ended as the host's starvation, retried for ever, instead of a timeout.
Where no pressure can be read (no unified cgroup2 hierarchy, PSI off) the threads' waits are
added up in its place.

A stopped thread waits for no CPU (neither measure grows): a run its own code stops (only the
run's own processes can send it a SIGSTOP) times out at its deadline, and one stopped and
continued (a job-control test) still has the host's starvation after it counted. The run gives
its time away itself, and from then on the wall clock counts, once one of its threads claims
less of a CPU than the host's processes do (`scheduling.gave_cpu_away`: a nice, SCHED_IDLE, fewer
CPUs): it then waits by its own doing, times out at `limits.timeout_s` of wall time whatever
the host's load, and never ends as the host's starvation.

Not covered: a host without a pressure file of the run's own, where a crowd of threads that
wake together, each waiting briefly for its siblings, can still add up to more waits than the
run lost (at most the wall time they ran in). Without cgroups (not root), no waits are known
and the wall clock counts. The script's processes leave the worker's own cgroup v2 group (a
systemd unit's, on a hybrid host) for their pressure group, as they leave its v1 groups for
memory and pids; `--die-with-parent` still ends them with the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

from contracts.task import SandboxLimits
from infra.sandbox.cgroups import CGROUP_ROOT, Cgroups
from infra.sandbox.judge import deadline_state
from infra.sandbox.scheduling import gave_cpu_away, run_delay

WAIT_POLL_S = 0.25
"""How often a command whose deadline counts its own time has its waits read."""
UNIFIED = CGROUP_ROOT / "unified"
"""The cgroup v2 hierarchy beside v1's controllers on a hybrid host: a group there needs no
controller for the kernel to count its CPU pressure."""
CGROUP2_MOUNT = "cgroup2"
"""The file system type /proc/self/mountinfo names for a cgroup v2 hierarchy."""


def pressure_group(name: str) -> Path | None:
    """A cgroup v2 group `tempered/<name>` whose CPU pressure can be read, made now, or None
    where there is none (`UNIFIED` is no cgroup2 mount, PSI off: its read fails). A dead
    worker's is removed by `cgroups.sweep_dead_workers` (it walks every hierarchy's `tempered`
    folder)."""
    if not is_cgroup2_mount(UNIFIED):  # else mkdir would make plain directories (a tmpfs's)
        return None
    path = UNIFIED / "tempered" / name
    try:
        path.parent.mkdir(exist_ok=True)
        path.mkdir(exist_ok=True)
    except OSError:
        return None
    if stalled(path) is None:
        with contextlib.suppress(OSError):
            path.rmdir()
        return None
    return path


def is_cgroup2_mount(path: Path) -> bool:
    """Whether the last mount on `path` (/proc/self/mountinfo: the one a lookup finds) is a
    cgroup v2 hierarchy."""
    found = ""
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", encoding="utf-8") as table:
        for line in table:
            mount, _, source = line.partition(" - ")
            if mount.split(" ")[4:5] == [str(path)]:  # its fifth field: the mount point
                found = source.split(" ")[0]  # the first after the dash: the type
    return found == CGROUP2_MOUNT


def stalled(group: Path) -> float | None:
    """Seconds in which some thread of `group` was runnable but not run (`cpu.pressure`'s
    "some" total, in microseconds), or None where it cannot be read."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        some = next(line for line in (group / "cpu.pressure").read_text().splitlines()
                    if line.startswith("some "))  # fmt: skip
        return int(some.rpartition("total=")[2]) / 1e6
    return None


class CpuWaits:
    """The CPU waits of a run's cgroups, and the run's CPU time."""

    def __init__(self, cgroups: Cgroups) -> None:
        self.cgroups = cgroups
        self.pressure = pressure_group(cgroups.name)
        self.stalled = stalled(self.pressure) if self.pressure is not None else None
        """The pressure group's stall at the last look (a reused name's holds an earlier
        run's), or None where it could not be read."""
        self.waits: dict[tuple[int, str], float] = {}
        """(thread id, its start time: a reused id is another thread) → its largest wait seen."""
        self.counted, self.looked = 0.0, time.monotonic()
        self.gave_away = ""
        """How the run gave its time away, once a look saw it ("" if never)."""

    def procs_files(self) -> list[Path]:
        """What the launching shell joins besides the run's cgroups."""
        return [self.pressure / "cgroup.procs"] if self.pressure is not None else []

    def close(self) -> None:
        """Remove the pressure group (once the run's processes are gone: a group that still
        holds one stays, for the sweep of dead workers)."""
        if self.pressure is not None:
            with contextlib.suppress(OSError):
                self.pressure.rmdir()

    def sample(self) -> tuple[float, float] | None:
        """(the waits so far, the run's CPU seconds) as `deadline_state` takes them; None once
        the run gave its time away."""
        used, cpu, tick = self.cgroups.cpu_used(), 0.0, os.sysconf("SC_CLK_TCK")
        waits: dict[tuple[int, str], float] = {}
        for pid in self.cgroups.pids():
            tids: list[int] = []
            with contextlib.suppress(OSError, ValueError, IndexError):  # gone meanwhile
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
                cpu += sum(int(field) for field in fields[11:15]) / tick  # utime .. cstime
                tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
            for tid in tids:
                with contextlib.suppress(OSError, ValueError, IndexError):
                    fields = Path(f"/proc/{tid}/stat").read_text().rpartition(")")[2].split()
                    waits[(tid, fields[19])] = run_delay(tid)  # field 22: its start time; 0: gone
                    self.gave_away = self.gave_away or gave_cpu_away(tid, fields)
        pressure = stalled(self.pressure) if self.pressure is not None else None
        waited = self.look(time.monotonic(), pressure, waits)
        if self.gave_away:
            return None
        return waited, max(cpu, used or 0.0)

    def look(
        self, now: float, pressure: float | None, waits: dict[tuple[int, str], float]
    ) -> float:
        """Count the wall seconds the run waited for a CPU since the last look and return the
        count so far: the larger of its group's stall since then (`pressure`: the total now;
        None where unread, and its threads' waits added up count instead) and the largest wait
        one thread added (`waits`: each thread's total now), at most the wall time since then."""
        grown = [max(wait - self.waits.get(key, 0.0), 0.0) for key, wait in waits.items()]
        for key, wait in waits.items():
            self.waits[key] = max(self.waits.get(key, 0.0), wait)
        if pressure is not None and self.stalled is not None:
            crowd = max(pressure - self.stalled, 0.0)
        else:
            crowd = sum(grown)
        self.stalled = pressure
        self.counted += min(max(crowd, max(grown, default=0.0)), max(now - self.looked, 0.0))
        self.looked = now
        return self.counted


async def wait_out(
    process: asyncio.subprocess.Process, limits: SandboxLimits, waits: CpuWaits | None
) -> str:
    """Why the host stopped waiting for `process`: "" (it exited), "timeout" (its deadline
    passed: wall time, or with `waits` its own time) or "starved" (`deadline_state`)."""
    ended, started = asyncio.ensure_future(process.wait()), time.monotonic()
    try:
        if waits is None:
            done, _ = await asyncio.wait({ended}, timeout=limits.timeout_s)
            return "" if done else "timeout"
        while True:
            elapsed = time.monotonic() - started
            wait = waits.sample()
            # Before the deadline, the CPU time of threads that ran side by side ends nothing.
            before = elapsed < limits.timeout_s
            state = "running" if before else deadline_state(elapsed, wait, limits)
            if state != "running":
                return state
            remaining = limits.timeout_s - elapsed
            pause = min(WAIT_POLL_S, remaining) if remaining > 0 else WAIT_POLL_S
            if (await asyncio.wait({ended}, timeout=pause))[0]:
                return ""
    finally:
        ended.cancel()
