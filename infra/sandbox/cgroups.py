"""Per-run cgroups v1 (memory, pids) for the local sandbox backend.

    cgroups = Cgroups.create("1234-7")     # /sys/fs/cgroup/{memory,pids}/tempered/1234-7
    cgroups.apply(limits)                  # memory.limit_in_bytes, pids.max
    ... start the sandbox inside them (its launcher writes its pid to `procs_files()`) ...
    cgroups.oom_killed(); cgroups.kill_all(spare=launcher_pid); cgroups.remove()

No cpu controller: a shared parent group would squeeze all sandboxes into one task's CPU share
under load; CPU time is bounded by RLIMIT_CPU and wall time by the deadline instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from contracts.task import SandboxLimits
from infra.sandbox.base import SandboxInfraError

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_CONTROLLERS = ("memory", "pids")
MB = 1 << 20
OVERHEAD_PROCESSES = 2
"""bwrap's outer process and its pid-1 init run under the sandbox uid too."""


class Cgroups:
    """One run's cgroups v1 directories (memory, pids); `None` from `create` if unavailable."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths = paths

    @staticmethod
    def available() -> bool:
        return os.geteuid() == 0 and all(
            os.access(CGROUP_ROOT / ctl, os.W_OK) and (CGROUP_ROOT / ctl / "cgroup.procs").exists()
            for ctl in CGROUP_CONTROLLERS
        )

    @classmethod
    def create(cls, name: str) -> Cgroups:
        paths = {ctl: CGROUP_ROOT / ctl / "tempered" / name for ctl in CGROUP_CONTROLLERS}
        try:
            for path in paths.values():
                path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            cls(paths).remove()
            raise SandboxInfraError(f"cannot create cgroups {name}: {exc}") from exc
        return cls(paths)

    def apply(self, limits: SandboxLimits) -> None:
        """Set the run's memory and process limits (before its job reaches the sandbox)."""
        paths = self.paths
        try:
            memory = str(limits.memory_mb * MB)
            (paths["memory"] / "memory.limit_in_bytes").write_text(memory)
            with contextlib.suppress(OSError):  # absent without swap accounting
                (paths["memory"] / "memory.memsw.limit_in_bytes").write_text(memory)
            (paths["pids"] / "pids.max").write_text(str(limits.max_processes + OVERHEAD_PROCESSES))
        except OSError as exc:
            raise SandboxInfraError(
                f"cannot set cgroup limits in {paths['memory']}: {exc}"
            ) from exc

    @staticmethod
    def sweep_stale() -> None:
        """Remove empty run cgroups left by workers that died (named `<worker pid>-<slot>`)."""
        for ctl in CGROUP_CONTROLLERS:
            for path in (CGROUP_ROOT / ctl / "tempered").glob("*-*"):
                pid = path.name.split("-", 1)[0]
                if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                    with contextlib.suppress(OSError):
                        path.rmdir()

    def procs_files(self) -> list[Path]:
        return [path / "cgroup.procs" for path in self.paths.values()]

    def oom_killed(self) -> bool:
        try:
            control = (self.paths["memory"] / "memory.oom_control").read_text()
            failcnt = int((self.paths["memory"] / "memory.failcnt").read_text())
        except OSError:
            return False
        kills = dict(line.split() for line in control.splitlines()).get("oom_kill", "0")
        return int(kills) > 0 or failcnt > 0

    def pids(self) -> list[int]:
        pids: set[int] = set()
        for procs in self.procs_files():
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(line) for line in procs.read_text().split())
        return sorted(pids)

    def kill_all(self, spare: int | None = None) -> None:
        """SIGKILL every process in the cgroups but `spare` (the launcher, which reaps the rest)."""
        for pid in self.pids():
            if pid == spare:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def remove(self) -> None:
        for path in self.paths.values():
            with contextlib.suppress(OSError):
                path.rmdir()
