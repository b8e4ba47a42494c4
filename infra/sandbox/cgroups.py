"""Per-run cgroups v1 (memory, pids) for the verifier's candidates (local and gVisor backends).

    cgroups = Cgroups.create("1234-7")     # /sys/fs/cgroup/{memory,pids}/tempered/1234-7
    cgroups.apply(limits)                  # memory.limit_in_bytes, pids.max
    ... the candidate joins them (local: it writes itself to `cgroup.procs`; gVisor: runsc
        makes a child group for the whole sandbox) ...
    cgroups.memory_event(); await cgroups.reap()   # SIGKILL until empty, then remove
    sweep_dead_workers()                   # at a worker's start: what dead workers left
                                           # (their groups, and gVisor's dirs: `WORKER_DIRS`)

`memory_event` tells an OOM kill at the run's own limit ("limit": a kill, and the group reached
its limit) from one the limit did not cause ("global": the kernel's OOM killer took one of the
run's processes while the group stayed under its limit, i.e. the host ran out of memory); a
peak at the limit without a kill is no event (a freed peak made a later CPU kill read as
memory). From cgroup v1's peak usage and failure counts and `memory.oom_control`'s `oom_kill`,
summed over the run's group and those below it (gVisor's); a kernel without that count gives
"reached" for a peak at the limit, which the judge weighs only for a SIGKILL.

No cpu controller: a shared parent group would squeeze all sandboxes into one task's CPU share
under load; CPU time is bounded by RLIMIT_CPU and wall time by the deadline instead. The
cpuacct controller, where it is a hierarchy of its own (it only counts), gives each run a group
whose `cpuacct.usage` counts every process that ran in it, exited ones too (`cpu_wait`): the
candidate joins memory and pids itself (`confine.py`), so the host moves it into its cpuacct
group (`track_cpu`), and all it forks later is born there. Without a separate cpuacct (cgroup
v1 with cpu,cpuacct co-mounted), `cpu_wait` counts only the CPU of live processes and of the
children they reaped: children reaped by nobody (SIGCHLD ignored) leave no trace, so a program
can then fake the host's starvation (a platform fault, retried) instead of timing out.

The run's wait for a CPU is its pid 1's (`cpu_wait`), unless that process gave its CPU away
itself, when no wait of its is the host's doing (both read by `scheduling.py`); a zygote
child's pid on this host is `host_pid`. A run under a kernel of its sandbox's own
(`own_kernel`: gVisor, whose namespace's pid 1 is runsc's idle gofer and whose program runs on
host threads of gVisor's) waits as its sandbox's threads do (`cpu_wait`). Counts start at
`apply`, the run's start, so a warm container's boot is not the program's.

Not covered: what the scheduler says of one process (`scheduling.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from contracts.task import SandboxLimits
from infra.processes import dead_worker_name, sweep_dead_worker_dirs
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.judge import MemoryEvent
from infra.sandbox.process import KILL_GRACE_S
from infra.sandbox.scheduling import gave_cpu_away, run_delay

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_CONTROLLERS = ("memory", "pids")
MB = 1 << 20
LIMIT_SLACK = 4 * MB
"""How close to its limit a group's peak usage must come for the limit to count as reached."""
OVERHEAD_PROCESSES = 2
"""Processes a bwrap sandbox runs beside the program (its outer process and its init)."""
KILL_POLL_S = 0.005
"""The pause between two rounds of SIGKILLs while a group empties."""
CPUACCT = CGROUP_ROOT / "cpuacct"
TRACK_ROUNDS = 20
"""How often `track_cpu` looks again for processes forked while it moved their parents."""
WORKER_DIRS = ("tempered-gvisor-", "tempered-runsc-")
"""The gVisor backend's directories in the temp dir (its containers' bundles, runsc's state:
`gvisor.py`), each named by its prefix, its worker's pid and a dash: a dead worker's are swept
with its groups (`sweep_dead_workers`)."""
SHELLS_DIR = "tempered-shells-"
"""The prefix of a worker's execute-only shells' directory in the temp dir (`sealed.py`), named
as `WORKER_DIRS`' are: a dead worker's is swept with its groups."""


class Cgroups:
    """One run's cgroups v1 directories (memory, pids; its cpuacct group where there is one)."""

    def __init__(
        self, paths: dict[str, Path], cpuacct: Path | None = None, own_kernel: bool = False
    ) -> None:
        self.paths, self.cpuacct, self.own_kernel = paths, cpuacct, own_kernel
        self.gave_away = ""
        """How the run's pid 1 gave its CPU away, once `cpu_wait` saw it ("" if never)."""
        self._cpu_before, self._waits_before = 0.0, dict[int, float]()
        """The group's CPU seconds and its threads' waits at `apply` (the run's start)."""

    @staticmethod
    def available() -> bool:
        return os.geteuid() == 0 and all(
            os.access(CGROUP_ROOT / ctl, os.W_OK) and (CGROUP_ROOT / ctl / "cgroup.procs").exists()
            for ctl in CGROUP_CONTROLLERS
        )

    @staticmethod
    def prepare() -> bool:
        """Whether cgroups can be used; if so, make each controller's `tempered` folder, which
        the candidate zygote binds before any run has created a group in it (a fresh boot)."""
        if not Cgroups.available():
            return False
        for ctl in CGROUP_CONTROLLERS:
            (CGROUP_ROOT / ctl / "tempered").mkdir(exist_ok=True)
        return True

    @staticmethod
    def cpuacct_available() -> bool:
        """Whether cpuacct is a hierarchy of its own: co-mounted with cpu, a run's group there
        would also share out CPU (see the module's note), so it is not used then."""
        return (
            os.access(CPUACCT, os.W_OK)
            and (CPUACCT / "cpuacct.usage").exists()
            and not (CPUACCT / "cpu.shares").exists()
        )

    @classmethod
    def named(cls, name: str, own_kernel: bool = False) -> Cgroups:
        """The groups called `name` under each controller's `tempered` folder (not created)."""
        paths = {ctl: CGROUP_ROOT / ctl / "tempered" / name for ctl in CGROUP_CONTROLLERS}
        cpuacct = CPUACCT / "tempered" / name if cls.cpuacct_available() else None
        return cls(paths, cpuacct, own_kernel)

    @classmethod
    def create(cls, name: str, own_kernel: bool = False) -> Cgroups:
        cgroups = cls.named(name, own_kernel)
        try:
            for path in cgroups.paths.values():
                path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            cgroups.remove()
            raise SandboxInfraError(f"cannot create cgroups {name}: {exc}") from exc
        if cgroups.cpuacct is not None:
            try:
                cgroups.cpuacct.mkdir(parents=True, exist_ok=True)
            except OSError:  # only counting is lost: `cpu_wait` falls back to live processes
                cgroups.cpuacct = None
        return cgroups

    @property
    def name(self) -> str:
        return self.paths["memory"].name

    def apply(
        self,
        limits: SandboxLimits,
        memory_overhead_mb: int = 0,
        processes_overhead: int = OVERHEAD_PROCESSES,
    ) -> None:
        """Set the run's memory and process limits (before its job reaches the sandbox), plus
        what the sandbox itself needs on top of the program's (gVisor's kernel)."""
        paths = self.paths
        try:
            memory = str((limits.memory_mb + memory_overhead_mb) * MB)
            (paths["memory"] / "memory.limit_in_bytes").write_text(memory)
            with contextlib.suppress(OSError):  # absent without swap accounting
                (paths["memory"] / "memory.memsw.limit_in_bytes").write_text(memory)
            pids = limits.max_processes + processes_overhead
            (paths["pids"] / "pids.max").write_text(str(pids))
        except OSError as exc:
            raise SandboxInfraError(
                f"cannot set cgroup limits in {paths['memory']}: {exc}"
            ) from exc
        # The verifier's candidate waits for its job here, so it has forked nothing yet; one
        # that has not joined its groups yet (a pair forked just now) is moved at `cpu_wait`.
        self._cpu_before = self._usage() or 0.0  # `_usage` moves it into its cpuacct group
        self._waits_before = self._thread_waits() if self.own_kernel else {}

    def procs_files(self) -> list[Path]:
        return [path / "cgroup.procs" for path in self.paths.values()]

    def memory_event(self) -> MemoryEvent:
        """ "limit" if a process of the run was OOM-killed and the group reached its memory
        limit, "global" if one was OOM-killed while it never did, "reached" if the kernel counts
        no OOM kills (no `oom_kill` in `memory.oom_control`, before Linux 4.13) and the group
        reached it, else "" (also when unreadable). A limit reached is no OOM kill: the peak is
        the whole run's (memory touched once and freed, page cache). OOM kills are summed over
        the groups below too (v1 counts one in its victim's own group only: runsc's is below).
        Reached: a failed charge was counted, or the peak usage came within `LIMIT_SLACK` of the
        limit (some kernels no longer count cgroup v1's failcnt, this one not where memsw is
        limited; an allocation that fails may be that large)."""
        memory = self.paths["memory"]
        kills: int | None = None  # None: the kernel counts no OOM kills

        def read(name: str) -> int:
            with contextlib.suppress(OSError, ValueError):  # memsw: absent without swap accounting
                return int((memory / name).read_text())
            return 0

        for folder, _, files in os.walk(memory):
            if "memory.oom_control" in files:
                with contextlib.suppress(OSError, ValueError, IndexError):  # a group gone now
                    fields = (Path(folder) / "memory.oom_control").read_text().split()
                    if "oom_kill" in fields:
                        kills = (kills or 0) + int(fields[fields.index("oom_kill") + 1])
        if kills == 0 or not (memory / "memory.oom_control").is_file():
            return ""
        reached = read("memory.failcnt") + read("memory.memsw.failcnt") > 0 or (
            read("memory.max_usage_in_bytes") >= read("memory.limit_in_bytes") - LIMIT_SLACK
        )
        if kills is None:
            return "reached" if reached else ""
        return "limit" if reached else "global"

    def process_limit_reached(self) -> bool:
        """Whether the group's process count ever reached its limit (its peak, counted over
        the groups below it too: gVisor's Sentry dies when it cannot start a thread). A
        high-water mark of the whole run: the judge blames an end on it only when nothing
        else explains that end (`judge._ended_early`)."""
        pids = self.paths["pids"]
        try:
            peak, limit = (pids / "pids.peak").read_text(), (pids / "pids.max").read_text()
            return limit.strip() != "max" and int(peak) >= int(limit)
        except (OSError, ValueError):  # kernels before 6.8 have no pids.peak
            return False

    def track_cpu(self) -> None:
        """Move every process of the run that is not yet in its cpuacct group (or a group
        below it: runsc's) into it; again until none is left out, as a process may fork while
        its parent is moved. Moved late (at the first `cpu_wait`, `timeout_s` in), a program
        still cannot fake starvation: its pid 1 then waits only while its own processes, now
        counted, hold the CPU, and `starvation_bound` leaves it 3 x `timeout_s` more."""
        if self.cpuacct is None:
            return
        for _ in range(TRACK_ROUNDS):
            outside = set(self.pids()) - set(_procs_below(self.cpuacct))
            if not outside:
                return
            for pid in outside:
                with contextlib.suppress(OSError):  # gone already
                    (self.cpuacct / "cgroup.procs").write_text(str(pid))

    def cpu_used(self) -> float | None:
        """CPU seconds of everything that ran in the run's cpuacct group since `apply`
        (exited processes included); None without one."""
        usage = self._usage()
        return None if usage is None else usage - self._cpu_before

    def _usage(self) -> float | None:
        if self.cpuacct is None:
            return None
        self.track_cpu()
        try:
            return int((self.cpuacct / "cpuacct.usage").read_text()) / 1e9
        except (OSError, ValueError):
            return None

    def cpu_wait(self) -> tuple[float, float] | None:
        """(seconds the run's pid 1, the process that answers the checker, spent runnable but
        waiting for a CPU; CPU seconds the run's processes used), from the kernel's schedstat
        and stat; None when no process of the run is its sandbox's pid 1, or once its pid 1
        gave its CPU away (`gave_cpu_away`; for good: it may take back some of it between two
        looks), as its waits are then its own doing. The CPU is the cpuacct group's count
        where there is one (`cpu_used`: it keeps what processes that exited used, which a
        program could otherwise burn in children nobody reaps while its pid 1 waits for the
        CPU they hold, and so pass off its timeout as the host's starvation), never less than
        what the live processes and their reaped children used (CPU a process used before it
        was moved into the group). Under a kernel of its sandbox's own (`own_kernel`), see
        `_sandbox_wait`."""
        used = self.cpu_used()
        if self.own_kernel:
            return self._sandbox_wait(used)
        wait, cpu, found, tick = 0.0, 0.0, False, os.sysconf("SC_CLK_TCK")
        for pid in self.pids():
            with contextlib.suppress(OSError, ValueError, IndexError, StopIteration):
                proc = Path(f"/proc/{pid}")
                fields = (proc / "stat").read_text().rpartition(")")[2].split()
                cpu += sum(int(field) for field in fields[11:15]) / tick  # utime .. cstime
                status = (proc / "status").read_text().splitlines()
                if next(line for line in status if line.startswith("NSpid:")).split()[-1] == "1":
                    wait, found = run_delay(pid), True
                    self.gave_away = self.gave_away or gave_cpu_away(pid, fields)
        return (wait, max(cpu, used or 0.0)) if found and not self.gave_away else None

    def _sandbox_wait(self, used: float | None) -> tuple[float, float] | None:
        """`cpu_wait` of a run under gVisor: the longest wait since `apply` of any of its
        sandbox's host threads, and the group's CPU (None without a cpuacct group: the wall
        clock counts). gVisor moves the program's work between host threads of its own (its
        kernel's, the stubs that run the program's code), so no one of them answers the
        checker; when the host starves the sandbox, the thread running the program's code
        waits nearly all the time. The program can make one of them wait only by using the CPU
        itself, which counts: their nice, policy and CPUs are gVisor's, whose kernel keeps the
        program's own settings to itself."""
        waits = self._thread_waits()
        if not waits or used is None:
            return None
        return max(wait - self._waits_before.get(tid, 0.0) for tid, wait in waits.items()), used

    def _thread_waits(self) -> dict[int, float]:
        """`run_delay` of every thread of the run's processes, by thread id."""
        waits = {}
        for pid in self.pids():
            with contextlib.suppress(OSError):  # gone meanwhile
                for tid in map(int, os.listdir(f"/proc/{pid}/task")):
                    waits[tid] = run_delay(tid)
        return waits

    def pids(self) -> list[int]:
        """Every process in the groups and the groups below them (gVisor's sandbox group, which
        runsc may remove while this walks: `os.walk` skips a folder that is gone)."""
        pids: set[int] = set()
        for path in self.paths.values():
            pids.update(_procs_below(path))
        return sorted(pids)

    def kill_all(self, spare: int | None = None) -> None:
        """SIGKILL every process in the cgroups but `spare` (a launcher that reaps the rest)."""
        for pid in self.pids():
            if pid == spare:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    async def reap(self, grace_s: float = KILL_GRACE_S) -> bool:
        """SIGKILL what is in the groups until they are empty (at most `grace_s`), then remove
        them; whether they emptied (a group that did not stays, and its slot must not be reused)."""
        for pause in self._kill_rounds(grace_s):
            await asyncio.sleep(pause)
        return self._remove_if_empty()

    def reap_blocking(self, grace_s: float = KILL_GRACE_S) -> bool:
        """`reap` for synchronous callers (a sweep at start, or in a thread)."""
        for pause in self._kill_rounds(grace_s):
            time.sleep(pause)
        return self._remove_if_empty()

    def _kill_rounds(self, grace_s: float) -> Iterator[float]:
        """Kill everything, and yield a pause before the next round, until none is left."""
        for _ in range(int(grace_s / KILL_POLL_S)):
            self.kill_all()
            if not self.pids():
                return
            yield KILL_POLL_S

    def _remove_if_empty(self) -> bool:
        empty = not self.pids()
        self.remove()
        return empty

    def remove(self) -> None:
        for path in [*self.paths.values(), *([self.cpuacct] if self.cpuacct else [])]:
            with contextlib.suppress(OSError):
                path.rmdir()


def host_pid(ancestor: int, inner: int) -> int | None:
    """The pid on this host of the descendant of `ancestor` whose pid is `inner` in a pid
    namespace of its own (a zygote's child: the zygote says `inner`); None if there is none."""
    todo = [ancestor]
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError, ValueError, StopIteration):  # gone meanwhile
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            nspid = next(line for line in status if line.startswith("NSpid:")).split()[1:]
            if len(nspid) > 1 and int(nspid[-1]) == inner:
                return pid
            for task in os.listdir(f"/proc/{pid}/task"):
                todo += map(int, Path(f"/proc/{pid}/task/{task}/children").read_text().split())
    return None


def _procs_below(path: Path) -> set[int]:
    """The processes in the group at `path` and in the groups below it."""
    pids: set[int] = set()
    for folder, _, files in os.walk(path):
        if "cgroup.procs" in files:
            with contextlib.suppress(OSError, ValueError):
                text = (Path(folder) / "cgroup.procs").read_text()
                pids.update(int(line) for line in text.split())
    return pids


def _inside(path: Path) -> list[Path]:
    """Everything below `path`, deepest first; walked again where runsc removed a group of its
    own meanwhile (FileNotFoundError: it failed a sweep)."""
    for _ in range(3):
        with contextlib.suppress(FileNotFoundError):
            return sorted(path.rglob("*"), reverse=True)
    return []


def sweep_dead_workers(pid: int | None = None) -> int:
    """Reap the run groups of workers that died: every dead worker's, or only `pid`'s (the
    caller knows it is dead). A run's group is `<worker pid>-<slot>` under any controller's
    `tempered` folder (runsc makes one in each, with groups of its own below); what still runs
    in one is killed, then it is removed bottom-up. Then their gVisor directories go
    (`WORKER_DIRS`: what ran from them was in their groups). Returns how many runs' groups
    there were; a dead worker's sealed shells go too (`SHELLS_DIR`). The verifier sweeps at its start, the workspace sessions when they find a dead
    worker's directory: one walk for both (a worker's pid may name groups of either)."""
    pattern = f"{pid}-*" if pid is not None else "*-*"
    groups: dict[str, list[Path]] = {}
    for path in CGROUP_ROOT.glob(f"*/tempered/{pattern}") if Cgroups.available() else []:
        if dead_worker_name(path.name, pid):
            groups.setdefault(path.name, []).append(path)
    for name, paths in groups.items():
        Cgroups.named(name).reap_blocking()
        for path in paths:
            for below in _inside(path):
                with contextlib.suppress(OSError):  # a control file, not a group
                    below.rmdir()
            with contextlib.suppress(OSError):
                path.rmdir()
    for prefix in (*WORKER_DIRS, SHELLS_DIR):
        sweep_dead_worker_dirs(Path(tempfile.gettempdir()), prefix, pid)
    return len(groups)
