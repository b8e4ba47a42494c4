"""What the kernel's scheduler says of one process: its wait for a CPU, and whether it gave its
CPU away itself.

    run_delay(pid)                 # seconds runnable but waiting for a CPU (/proc/<pid>/schedstat)
    gave_cpu_away(pid, fields)     # "" or how it claims less of a CPU than the host's processes

A deadline counts a program's time, not the time the host kept it from a CPU (`judge.py`): the
verifier reads the checker's wait (`verifier_job.py`) and its candidate's (`Cgroups.cpu_wait`),
a Harbor check script's deadline its threads' (`workspace_deadline.py`). A wait the program
caused itself, by giving its CPU away, is not the host's doing (`gave_cpu_away`).

Not covered: which processes make up a run, and the CPU they used (`cgroups.py`).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def run_delay(pid: int | None) -> float:
    """Seconds the process `pid` (its main thread) spent runnable but waiting for a CPU
    (/proc/<pid>/schedstat); 0 for none, or one that is gone."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9 if pid else 0.0
    return 0.0


def gave_cpu_away(pid: int, fields: list[str]) -> str:
    """How the process `pid` (its /proc stat `fields` after the name) claims less of a CPU than
    this host's processes do, or "": a higher nice, another scheduling policy (SCHED_IDLE),
    its session's autogroup niced, or fewer CPUs. A program may do each of these to itself
    (the kernel lets any process lower its own claim), and then waits for a CPU by its own
    doing: a busy CPU it moved onto, a share it gave to others."""
    nice, policy = int(fields[16]), int(fields[38])  # stat fields 19 (nice), 41 (policy)
    if nice > os.getpriority(os.PRIO_PROCESS, 0):
        return f"nice {nice}"
    if policy != os.sched_getscheduler(0):
        return f"scheduling policy {policy}"
    with contextlib.suppress(OSError, ValueError, IndexError):  # no autogroups in this kernel
        autogroup = Path(f"/proc/{pid}/autogroup").read_text().split()  # "/autogroup-7 nice 0"
        if int(autogroup[-1]) > 0:
            return f"autogroup nice {autogroup[-1]}"
    if not os.sched_getaffinity(0) <= os.sched_getaffinity(pid):
        return f"CPUs {sorted(os.sched_getaffinity(pid))}"
    return ""
