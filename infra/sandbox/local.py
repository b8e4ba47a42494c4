"""The `local` sandbox backend: bubblewrap, one fresh sandbox per program.

Each run gets its own uid (no host account; RLIMIT_NPROC is per uid), its own cgroups (memory,
pids under /sys/fs/cgroup/<ctl>/tempered/, cgroups v1) when the host allows, and a bwrap
sandbox with every namespace unshared (no network at all, own pid/ipc/uts/user/cgroup), all
capabilities dropped, no nested user namespaces, read-only /usr, a private size-limited tmpfs
at /tmp as its work dir, an empty environment, and `--die-with-parent --new-session`. The
sandbox's pid 1 is bwrap's init: when the program exits or is killed at its deadline, every
process it left behind dies with the pid namespace.

    backend = LocalBackend(load_settings().sandbox.local)       # or get_backend(settings)
    result = await backend.run("def add(a, b): return a + b", tests, SandboxLimits(), "add")

The verdict comes from `harness.py` over a private pipe, signed with a per-run nonce.
"""

from __future__ import annotations

import asyncio
import os
import shlex
import shutil
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path

from contracts.sandbox import ExecutionResult
from contracts.task import SandboxLimits
from infra.sandbox.base import DEFAULT_LIMITS, SandboxInfraError
from infra.sandbox.cgroups import MB, OVERHEAD_PROCESSES, Cgroups
from infra.sandbox.harness_file import HARNESS_IN_SANDBOX, harness_file
from infra.sandbox.process import HarnessJob, Sandbox
from infra.settings import LocalSandboxSettings

UID_BASE = 100_000
"""Sandbox uids are UID_BASE + (worker pid % 512) * 8192 + slot: no host account owns them."""
SANDBOX_UID_RANGE = range(UID_BASE, UID_BASE + 512 * 8192)


def worker_uids(pid: int | None = None) -> range:
    """The sandbox uids of the worker process `pid` (default: this one)."""
    base = UID_BASE + ((os.getpid() if pid is None else pid) % 512) * 8192
    return range(base, base + 8192)


def root_binds() -> list[str]:
    """bwrap arguments for a read-only /usr and the /bin, /lib* entries of the host's root."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    return args


def bwrap_args(tmpfs_mb: int, harness: Path, inner_uid: int = 65534) -> list[str]:
    return [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--uid",
        str(inner_uid),
        "--gid",
        str(inner_uid),
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "sandbox",
        *root_binds(),
        "--ro-bind",
        str(harness),
        HARNESS_IN_SANDBOX,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(tmpfs_mb * MB),
        "--tmpfs",
        "/tmp",
        "--chdir",
        "/tmp",
        "--remount-ro",
        "/",
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "HOME",
        "/tmp",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--setenv",
        "MALLOC_ARENA_MAX",
        "2",
    ]


@dataclass
class Prepared:
    """A started sandbox waiting for its one job, with the uid slot and cgroups it holds."""

    sandbox: Sandbox
    slot: int
    tmpfs_mb: int
    cgroups: Cgroups | None


class LocalBackend:
    """Runs each program in a fresh bubblewrap sandbox under its own uid and cgroups.

    Warm pool: from its second run on, the backend keeps up to `warm` sandboxes started ahead
    of time per tmpfs size (bwrap + interpreter + harness, waiting on stdin). Each serves exactly
    one program and is then destroyed, so isolation between runs is that of a cold start; the
    pool only moves start-up off the latency path (`warm=0` turns it off; default
    `config.warm`).
    """

    name = "local"

    def __init__(self, config: LocalSandboxSettings | None = None, warm: int | None = None) -> None:
        config = config or LocalSandboxSettings()
        self.python = config.python
        self.bwrap = shutil.which("bwrap")
        self.setpriv = shutil.which("setpriv")
        self.use_cgroups = Cgroups.available()
        self.enforcement = "cgroup" if self.use_cgroups else "rlimit"
        if self.use_cgroups:
            Cgroups.sweep_stale()
        self.warm = config.warm if warm is None else warm
        self._uid_base = worker_uids().start
        self._free_slots: list[int] = []
        self._next_slot = 0
        self._pool: dict[int, list[Prepared]] = {}
        self._filling: dict[int, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._served = 0

    def _take_slot(self) -> int:
        if self._free_slots:
            return self._free_slots.pop()
        self._next_slot += 1
        if self._next_slot >= 8192:
            raise SandboxInfraError("more than 8191 concurrent sandboxes in one worker")
        return self._next_slot

    def command(self, tmpfs_mb: int, uid: int, cgroups: Cgroups | None) -> list[str]:
        """The argv that starts the harness: [join cgroups] → setpriv to `uid` → bwrap → python."""
        if not self.bwrap or not Path(self.python).exists():
            raise SandboxInfraError(f"bwrap ({self.bwrap}) or {self.python} is missing")
        sandbox = bwrap_args(tmpfs_mb, harness=harness_file(self.python))
        argv = [self.bwrap, *sandbox, self.python, "-S", "-I", HARNESS_IN_SANDBOX]
        if os.geteuid() == 0:
            if not self.setpriv:
                raise SandboxInfraError("running as root needs setpriv to drop to a sandbox uid")
            drop = [self.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--nnp"]
            argv = drop + argv
        if cgroups is not None:
            joins = "".join(f"echo $$ > {shlex.quote(str(p))} && " for p in cgroups.procs_files())
            argv = ["/bin/sh", "-c", joins + 'exec "$@"', "sandbox", *argv]
        return argv

    def rlimits(self, limits: SandboxLimits) -> dict[str, tuple[int, int]]:
        """Limits the harness sets on itself before running the program."""
        rlimits = {
            "RLIMIT_CPU": (limits.cpu_s, limits.cpu_s + 1),
            "RLIMIT_FSIZE": (limits.file_size_mb * MB, limits.file_size_mb * MB),
            "RLIMIT_CORE": (0, 0),
            "RLIMIT_NPROC": (limits.max_processes + OVERHEAD_PROCESSES,) * 2,
        }
        # Address space: the limit itself without cgroups; with them (which bound real memory),
        # a generous cap that turns absurd allocations into a fast MemoryError.
        space = limits.memory_mb * MB if not self.use_cgroups else (2 * limits.memory_mb + 256) * MB
        rlimits["RLIMIT_AS"] = (space, space)
        return rlimits  # type: ignore[return-value]

    async def run(
        self,
        program: str,
        tests: str = "",
        limits: SandboxLimits = DEFAULT_LIMITS,
        entry_point: str | None = None,
    ) -> ExecutionResult:
        prepared = self._take_warm(limits.tmpfs_mb) or await self._prepare(limits.tmpfs_mb)
        if self._served and self.warm:
            self._refill(limits.tmpfs_mb)
        self._served += 1
        cgroups = prepared.cgroups
        try:
            if cgroups is not None:
                cgroups.apply(limits)
            job = HarnessJob(program, tests, entry_point, limits, self.rlimits(limits))
            kill = (lambda launcher: cgroups.kill_all(spare=launcher)) if cgroups else None
            outcome = await prepared.sandbox.run(job, kill)
            oom = cgroups.oom_killed() if cgroups else False
            return outcome.result(self.name, limits, self.enforcement, oom_killed=oom)
        finally:
            await self._release(prepared)

    async def _prepare(self, tmpfs_mb: int) -> Prepared:
        slot = self._take_slot()
        cgroups = None
        try:
            cgroups = Cgroups.create(f"{os.getpid()}-{slot}") if self.use_cgroups else None
            argv = self.command(tmpfs_mb, self._uid_base + slot, cgroups)
            return Prepared(await Sandbox.spawn(argv), slot, tmpfs_mb, cgroups)
        except BaseException:
            if cgroups is not None:
                cgroups.remove()
            self._free_slots.append(slot)
            raise

    async def _release(self, prepared: Prepared) -> None:
        try:
            if prepared.sandbox.alive:
                kill = prepared.cgroups.kill_all if prepared.cgroups else None
                await prepared.sandbox.stop(lambda launcher: kill(launcher) if kill else None)
            if prepared.cgroups is not None:
                await _reap(prepared.cgroups)
        finally:
            self._free_slots.append(prepared.slot)

    def _take_warm(self, tmpfs_mb: int) -> Prepared | None:
        pool = self._pool.get(tmpfs_mb, [])
        while pool:
            prepared = pool.pop()
            if prepared.sandbox.alive:
                return prepared
            self._spawn_task(self._release(prepared))
        return None

    def _refill(self, tmpfs_mb: int) -> None:
        missing = self.warm - len(self._pool.get(tmpfs_mb, [])) - self._filling.get(tmpfs_mb, 0)
        for _ in range(max(missing, 0)):
            self._filling[tmpfs_mb] = self._filling.get(tmpfs_mb, 0) + 1
            self._spawn_task(self._fill_one(tmpfs_mb))

    async def _fill_one(self, tmpfs_mb: int) -> None:
        try:
            prepared = await self._prepare(tmpfs_mb)
        except SandboxInfraError:
            return  # the next cold start reports the fault
        finally:
            self._filling[tmpfs_mb] -= 1
        self._pool.setdefault(tmpfs_mb, []).append(prepared)

    def _spawn_task(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop filling the pool and destroy the idle sandboxes."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        idle = [prepared for pool in self._pool.values() for prepared in pool]
        self._pool.clear()
        await asyncio.gather(
            *(self._release(prepared) for prepared in idle), return_exceptions=True
        )


async def _reap(cgroups: Cgroups) -> None:
    """Kill whatever is left in the run's cgroups and remove them."""
    for _ in range(200):
        cgroups.kill_all()
        if not cgroups.pids():
            break
        await asyncio.sleep(0.005)
    cgroups.remove()
