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
not run: the kernel's CPU pressure ("some", `cpu.pressure`) of a cgroup v2 group of its own
(`pressure_group`: on a host with cgroup v1's controllers, the unified hierarchy beside them),
which the launching shell joins, so every process of the run is born in it. Never more than
the wall time: before, the waits of every thread were added up, and forty processes that spun
side by side for 0.75 s (each waiting for CPUs its siblings held: 26.6 s of waits, 1.2 s of CPU,
0.84 s of pressure) excused 26 s of a sleep or a SIGSTOP after them, so a wrong answer ended as
the host's starvation, retried for ever, instead of a timeout. Where no pressure can be read (no
unified hierarchy, PSI off) the threads' waits are added up between two looks and at most the
wall time between them is counted (`CpuWaits.waited`).

The run gives its time away itself, and from then on the wall clock counts, once one of its
threads claims less of a CPU than the host's processes do (`cgroups.gave_cpu_away`: a nice,
SCHED_IDLE, fewer CPUs) or is stopped by a signal (SIGSTOP: only the run's own processes can
send it one, and the workspace's code runs in the script's sandbox as the script's uid, so it
can stop the script): it then times out at `limits.timeout_s` of wall time, whatever the
host's load, and never ends as the host's starvation.

Not covered: a host without a pressure file of the run's own, where a crowd of threads that
wake together, each waiting briefly for its siblings, can still sum to more waits than the run
lost. Without cgroups (not root), no waits are known and the wall clock counts. The script's
processes leave the worker's own cgroup v2 group (a systemd unit's, on a hybrid host) for
their pressure group, as they leave its v1 groups for memory and pids; `--die-with-parent`
still ends them with the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

from contracts.task import SandboxLimits
from infra.sandbox.cgroups import CGROUP_ROOT, Cgroups, gave_cpu_away, run_delay
from infra.sandbox.judge import deadline_state

WAIT_POLL_S = 0.25
"""How often a command whose deadline counts its own time has its waits read."""
UNIFIED = CGROUP_ROOT / "unified"
"""The cgroup v2 hierarchy beside v1's controllers on a hybrid host: a group there needs no
controller for the kernel to count its CPU pressure."""
STOPPED = "a process of the run was stopped by a signal"


def pressure_group(name: str) -> Path | None:
    """A cgroup v2 group `tempered/<name>` whose CPU pressure can be read, made now, or None
    where there is none (no unified hierarchy, PSI off: its read fails). A dead worker's is
    removed by `cgroups.sweep_dead_workers` (it walks every hierarchy's `tempered` folder)."""
    path = UNIFIED / "tempered" / name
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if stalled(path) is None:
        with contextlib.suppress(OSError):
            path.rmdir()
        return None
    return path


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
        self.stalled_before = (stalled(self.pressure) or 0.0) if self.pressure else 0.0
        """A group of a reused name may hold an earlier run's count."""
        self.waits: dict[tuple[int, str], float] = {}
        """(thread id, its start time: a reused id is another thread) → its largest wait seen."""
        self.summed, self.counted, self.looked = 0.0, 0.0, time.monotonic()
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
        for pid in self.cgroups.pids():
            tids: list[int] = []
            with contextlib.suppress(OSError, ValueError, IndexError):  # gone meanwhile
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
                cpu += sum(int(field) for field in fields[11:15]) / tick  # utime .. cstime
                tids = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
            for tid in tids:
                with contextlib.suppress(OSError, ValueError, IndexError):
                    fields = Path(f"/proc/{tid}/stat").read_text().rpartition(")")[2].split()
                    key = (tid, fields[19])  # field 22: its start time
                    self.waits[key] = max(self.waits.get(key, 0.0), run_delay(tid))  # 0: gone
                    stopped = STOPPED if fields[0] == "T" else ""  # field 3: its state
                    self.gave_away = self.gave_away or stopped or gave_cpu_away(tid, fields)
        waited = self.waited()
        if self.gave_away:
            return None
        return waited, max(cpu, used or 0.0)

    def waited(self) -> float:
        """Wall seconds the run waited for a CPU so far: its pressure group's stalls, else its
        threads' waits added up between two looks, at most the wall time between them."""
        now, summed = time.monotonic(), sum(self.waits.values())
        self.counted += min(max(summed - self.summed, 0.0), now - self.looked)
        self.summed, self.looked = summed, now
        pressure = stalled(self.pressure) if self.pressure is not None else None
        return self.counted if pressure is None else max(pressure - self.stalled_before, 0.0)


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
