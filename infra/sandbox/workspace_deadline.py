"""When a workspace command's deadline has passed: wall time, or the command's own time.

    waits = CpuWaits(cgroups)                         # a verifier's script (`own_time`)
    deadline = await wait_out(process, limits, waits)  # "" (it exited) | "timeout" | "starved"

An agent's step gets wall time (`waits` None). A Harbor check's script, whose timeout is a
score of 0, gets the functions check's rule (`judge.deadline_state`, its one home): it has had
its time once it used `limits.timeout_s` of the wall clock, not counting the time its threads
spent runnable but waiting for a CPU, unless they burnt that much CPU; "starved" when the host
never gave it that time within `judge.starvation_bound` (a platform fault, for the caller to
raise). The verifier measures its one answering process (`Cgroups.cpu_wait`); a script is a
tree of processes that come and go, so `CpuWaits` adds up the waits of every thread it saw, read
throughout the run (a starved step of the script that has ended counts too). Where threads
waited side by side the sum is more than the wall time they lost, and that is safe:
`deadline_state` takes the run's CPU time when it is larger, and a script whose threads wait
for CPUs its own threads hold uses those CPUs. A thread that gave its CPU away itself
(`cgroups.gave_cpu_away`: a nice, SCHED_IDLE, fewer CPUs) waits by its own doing: from then on
the wall clock counts.

Not covered: a script stopped by SIGSTOP is not waiting for a CPU, and its own processes could
have stopped it: that time counts (the functions kind's rule too). Without cgroups (not root),
no waits are known and the wall clock counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

from contracts.task import SandboxLimits
from infra.sandbox.cgroups import Cgroups, gave_cpu_away, run_delay
from infra.sandbox.judge import deadline_state

WAIT_POLL_S = 0.25
"""How often a command whose deadline counts its own time has its waits read."""


class CpuWaits:
    """The CPU waits of the threads of a run's cgroups, and the run's CPU time."""

    def __init__(self, cgroups: Cgroups) -> None:
        self.cgroups = cgroups
        self.waits: dict[tuple[int, str], float] = {}
        """(thread id, its start time: a reused id is another thread) → its largest wait seen."""
        self.gave_away = ""

    def sample(self) -> tuple[float, float] | None:
        """(the waits so far, the run's CPU seconds) as `deadline_state` takes them; None once
        a thread of the run gave its CPU away."""
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
                    self.gave_away = self.gave_away or gave_cpu_away(tid, fields)
        if self.gave_away:
            return None
        return sum(self.waits.values()), max(cpu, used or 0.0)


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
