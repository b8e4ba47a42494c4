"""The `gvisor` sandbox backend: the same harness and contract as `local`, under runsc.

Each run is a fresh OCI container (`runsc run`, network none, ptrace platform by default) with
an empty read-only root, read-only /usr, a size-limited tmpfs at /tmp, no capabilities,
no-new-privileges, uid 65534, rlimits, and memory/pids limits on the sandbox's cgroups. gVisor
passes stdio only, so the harness reports on stderr, still signed with the run's nonce.

    backend = GVisorBackend(load_settings().sandbox.gvisor)   # or get_backend(settings)
    result = await backend.run(program, tests, limits, entry_point)
    # SandboxInfraError where runsc cannot work (not installed, not root, kernel says no)

`settings.sandbox.gvisor.platform` (TEMPERED_SANDBOX__GVISOR__PLATFORM: ptrace|systrap|kvm)
picks runsc's platform.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from contracts.sandbox import ExecutionResult
from contracts.task import SandboxLimits
from infra.sandbox.base import DEFAULT_LIMITS, SandboxInfraError
from infra.sandbox.cgroups import MB, OVERHEAD_PROCESSES
from infra.sandbox.harness_file import HARNESS_IN_SANDBOX, harness_file
from infra.sandbox.process import HarnessJob, run_harness
from infra.settings import GVisorSettings

SENTRY_MEMORY_MB = 256
"""Memory of gVisor's own kernel (Sentry) on top of the program's limit."""


def oci_config(python: str, limits: SandboxLimits, rlimits: dict[str, tuple[int, int]]) -> dict:  # type: ignore[type-arg]
    ro = ["rbind", "ro", "nosuid", "nodev"]
    mounts = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "mode=755", "size=1m"],
        },
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", f"size={limits.tmpfs_mb}m", "mode=1777"],
        },
        {"destination": "/usr", "type": "bind", "source": "/usr", "options": ro},
    ]
    for name in ("bin", "lib", "lib64"):
        path = Path("/") / name
        if path.exists():
            mounts.append(
                {
                    "destination": str(path),
                    "type": "bind",
                    "source": str(path.resolve()),
                    "options": ro,
                }
            )
    return {
        "ociVersion": "1.0.0",
        "process": {
            "terminal": False,
            "user": {"uid": 65534, "gid": 65534},
            "args": [python, "-S", "-I", HARNESS_IN_SANDBOX],
            "env": ["PATH=/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8", "MALLOC_ARENA_MAX=2"],
            "cwd": "/tmp",
            "capabilities": {
                k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")
            },
            "rlimits": [
                {"type": name, "soft": soft, "hard": hard} for name, (soft, hard) in rlimits.items()
            ],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "sandbox",
        "mounts": mounts,
        "linux": {
            "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
            "resources": {
                "memory": {"limit": (limits.memory_mb + SENTRY_MEMORY_MB) * MB},
                "pids": {"limit": limits.max_processes + OVERHEAD_PROCESSES + 64},
            },
        },
    }


class GVisorBackend:
    """Runs each program in a fresh gVisor container."""

    name = "gvisor"
    enforcement = "cgroup"

    def __init__(self, config: GVisorSettings | None = None) -> None:
        config = config or GVisorSettings()
        self.python = config.python
        self.runsc = shutil.which("runsc")
        self.platform = config.platform
        self.state = (
            Path(tempfile.gettempdir()) / f"tempered-runsc-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        )
        """runsc's state dir for this backend's containers, removed by `close`."""

    def _runsc(self, *args: str) -> list[str]:
        if not self.runsc:
            raise SandboxInfraError("runsc is not installed")
        if os.geteuid() != 0:
            raise SandboxInfraError("the gvisor backend runs containers as root (runsc run)")
        return [
            self.runsc,
            "--root",
            str(self.state),
            "--network=none",
            f"--platform={self.platform}",
            *args,
        ]

    async def run(
        self,
        program: str,
        tests: str = "",
        limits: SandboxLimits = DEFAULT_LIMITS,
        entry_point: str | None = None,
    ) -> ExecutionResult:
        rlimits = {
            "RLIMIT_CPU": (limits.cpu_s, limits.cpu_s + 1),
            "RLIMIT_FSIZE": (limits.file_size_mb * MB,) * 2,
            "RLIMIT_CORE": (0, 0),
            "RLIMIT_NPROC": (limits.max_processes + OVERHEAD_PROCESSES,) * 2,
            "RLIMIT_AS": ((2 * limits.memory_mb + 256) * MB,) * 2,
        }
        container = f"tempered-{uuid.uuid4().hex[:16]}"
        bundle = Path(tempfile.mkdtemp(prefix="tempered-gvisor-"))
        try:
            argv = self._runsc("run", "--bundle", str(bundle), container)
            (bundle / "rootfs").mkdir()
            shutil.copy(
                harness_file(self.python), bundle / "rootfs" / HARNESS_IN_SANDBOX.lstrip("/")
            )
            (bundle / "config.json").write_text(
                json.dumps(oci_config(self.python, limits, rlimits))
            )
            outcome = await run_harness(
                argv,
                HarnessJob(program, tests, entry_point, limits, rlimits),
                kill=lambda _launcher: self._delete(container),
                verdict_on_stderr=True,
            )
            return outcome.result(self.name, limits, self.enforcement)
        finally:
            shutil.rmtree(bundle, ignore_errors=True)

    async def _delete(self, container: str) -> None:
        process = await asyncio.create_subprocess_exec(
            *self._runsc("delete", "--force", container),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), timeout=10)

    async def close(self) -> None:
        shutil.rmtree(self.state, ignore_errors=True)
