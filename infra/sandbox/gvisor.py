"""The `gvisor` sandbox backend: the two-process verifier with each candidate in a gVisor container.

    backend = GVisorBackend(load_settings().sandbox.gvisor)   # or get_backend(settings)
    result = await backend.run(program, tests, limits, entry_point, task.helpers, task.hidden_tests)
    # SandboxInfraError where runsc cannot work (not installed, not root, kernel says no)

The checker is the local backend's (a fork of the checker zygote on this host, `verifier.py`);
only the candidate differs: `RunscLauncher` starts a fresh OCI container per run (`runsc run`,
network none, `settings.sandbox.gvisor.platform`, ptrace by default) whose only process is
`python3 -S -I -c <zygote.py> serve 0 1 <codec, candidate sources>`: an empty read-only root,
the host's /usr and /lib read-only, a tmpfs /tmp of the run's size, no capabilities,
no-new-privileges, and the run's cgroups (memory, pids: the container's own group is made by
runsc inside them, so the run's limits and OOM events cover the whole sandbox). runsc passes
only stdio, so the calls arrive on the container's stdin, the replies leave on its stdout, and
the program's stdout and stderr both reach the result's `stdout`.

How a candidate ended comes from runsc's own log of its `run` command (debug level for that
command only, a file in the run's bundle): "Exiting with status: N" is the container's wait
status, and a failed wait RPC means the sandbox itself died (a platform fault). The program can
SIGKILL itself inside gVisor, so a SIGKILL is its own doing unless the sandbox died.

Not covered: gVisor's own isolation (the runtime's business); other runsc versions' log text
(a dead sandbox then reads as the program's own SIGKILL: `failed`, never `passed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import tempfile
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path

from infra.sandbox.base import SandboxInfraError, VerifierBackend
from infra.sandbox.cgroups import CGROUP_CONTROLLERS, CGROUP_ROOT
from infra.sandbox.forkserver import zygote_source
from infra.sandbox.judge import Exit
from infra.sandbox.launcher import CandidateSpec
from infra.sandbox.verifier import Verifier
from infra.settings import GVisorSettings

WARM = 2
"""Containers started ahead of time per tmpfs size (each ~0.2-0.5 s to start, ~30 MB idle)."""
SENTRY_MEMORY_MB = 256
"""Memory of gVisor's own kernel (Sentry) and gofer on top of the program's limit."""
SENTRY_PROCESSES = 256
"""Host tasks (threads) of the Sentry, the gofer and the ptrace stubs on top of the program's."""
CANDIDATE_MODULES = ("codec", "candidate")
"""What the container's interpreter loads (sources in its argv; nothing of the job)."""
EXITING = re.compile(r"Exiting with status: (\d+)")
SANDBOX_DIED = "Will try waiting on the sandbox process instead"
"""What runsc logs when the wait RPC to the sandbox failed: the sandbox itself is gone."""


def oci_config(python: str, spec: CandidateSpec) -> dict[str, object]:
    """The OCI runtime config of one candidate container."""
    ro = ["rbind", "ro", "nosuid", "nodev"]
    mounts: list[dict[str, object]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/tmp",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", f"size={spec.tmpfs_mb}m", "mode=1777"],
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
    here = Path(__file__).parent
    sources = [
        part
        for name in CANDIDATE_MODULES
        for part in (f"infra.sandbox.{name}", (here / f"{name}.py").read_text())
    ]
    linux: dict[str, object] = {
        "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]
    }
    if spec.cgroups is not None:
        linux["cgroupsPath"] = f"/tempered/{spec.cgroups.name}/sandbox"
    return {
        "ociVersion": "1.0.0",
        "process": {
            "terminal": False,
            "user": {"uid": spec.uid, "gid": spec.uid},
            "args": [python, "-S", "-I", "-c", zygote_source(), "serve", "0", "1", *sources],
            "env": ["PATH=/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8", "MALLOC_ARENA_MAX=2"],
            "cwd": "/tmp",
            "capabilities": {
                k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")
            },
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "sandbox",
        "mounts": mounts,
        "linux": linux,
    }


@dataclass
class _Container:
    name: str
    bundle: Path
    cgroup: str | None
    process: asyncio.subprocess.Process
    ended: asyncio.Future[Exit]
    killing: bool = False


class RunscLauncher:
    """Starts each candidate as a fresh gVisor container (see the module doc)."""

    sigkill_is_foreign = False
    """The program can SIGKILL itself in gVisor; a dead sandbox is reported as a fault."""
    memory_overhead_mb = SENTRY_MEMORY_MB
    processes_overhead = SENTRY_PROCESSES
    exit_grace_s = 3.0
    kill_grace_s = 10.0

    def __init__(self, config: GVisorSettings) -> None:
        self.python, self.platform = config.python, config.platform
        self.runsc = shutil.which("runsc")
        self.state = (
            Path(tempfile.gettempdir()) / f"tempered-runsc-{os.getpid()}-{secrets.token_hex(4)}"
        )
        """runsc's state dir for this launcher's containers, removed by `close`."""
        self._runs: dict[int, _Container] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def alive(self) -> bool:
        return self.runsc is not None

    async def start(self) -> None:
        if not self.runsc:
            raise SandboxInfraError("runsc is not installed (scripts/setup-system.sh installs it)")
        if os.geteuid() != 0:
            raise SandboxInfraError("the gvisor backend runs containers as root (runsc run)")

    def _runsc(self, *args: str) -> list[str]:
        assert self.runsc is not None
        return [
            self.runsc,
            "--root",
            str(self.state),
            "--network=none",
            f"--platform={self.platform}",
            *args,
        ]

    async def fork(self, run_id: int, spec: CandidateSpec, fds: list[int]) -> None:
        calls, replies, out, _ = fds  # the program's stderr joins its stdout (see the doc)
        bundle = Path(tempfile.mkdtemp(prefix="tempered-gvisor-"))
        name = f"tempered-{os.getpid()}-{run_id}-{secrets.token_hex(4)}"
        try:
            (bundle / "rootfs").mkdir()
            (bundle / "config.json").write_text(json.dumps(oci_config(self.python, spec)))
            debug = ["--debug", "--debug-command=run", f"--debug-log={bundle}/log/"]
            process = await asyncio.create_subprocess_exec(
                *self._runsc(*debug, "run", "--bundle", str(bundle), name),
                stdin=calls,
                stdout=replies,
                stderr=out,
                start_new_session=True,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            )
        except OSError as exc:
            shutil.rmtree(bundle, ignore_errors=True)
            raise SandboxInfraError(f"cannot start runsc: {exc}") from exc
        ended = asyncio.get_running_loop().create_future()
        cgroup = spec.cgroups.name if spec.cgroups is not None else None
        container = _Container(name, bundle, cgroup, process, ended)
        self._runs[run_id] = container
        self._spawn(self._watch(container))

    async def _watch(self, container: _Container) -> None:
        """Wait for `runsc run` to end, read how the container ended, clean up after it."""
        returncode = await container.process.wait()
        log = "".join(
            path.read_text(errors="replace") for path in (container.bundle / "log").glob("*")
        )
        statuses = EXITING.findall(log)
        fault = ""
        if returncode < 0:  # runsc itself was killed: by us (killing), or from outside
            status, fault = -returncode, f"runsc was killed by signal {-returncode}"
        elif SANDBOX_DIED in log:
            status, fault = signal.SIGKILL, "the gVisor sandbox died during the run"
        elif statuses:
            status = int(statuses[-1])
        else:
            status, fault = returncode << 8, f"runsc failed (exit {returncode})"
        if container.killing:
            fault = ""  # whatever the host's kill did is the host's doing, judged as such
        shutil.rmtree(container.bundle, ignore_errors=True)
        if container.cgroup is not None:
            _remove_runsc_cgroups(container.cgroup)
        if not container.ended.done():
            container.ended.set_result(Exit(status, 0.0, fault))

    def kill(self, run_id: int) -> None:
        container = self._runs.get(run_id)
        if container is not None and not container.ended.done() and not container.killing:
            container.killing = True
            self._spawn(self._delete(container))

    async def _delete(self, container: _Container) -> None:
        """`runsc delete --force` until `runsc run` is gone (a container still being created
        is not there to delete yet)."""
        for _ in range(int(self.kill_grace_s)):
            process = await asyncio.create_subprocess_exec(
                *self._runsc("delete", "--force", container.name),
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            await process.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(container.ended), 1.0)
                return

    async def exited(self, run_id: int, timeout_s: float) -> Exit:
        """How the run's container ended; TimeoutError if it is still running."""
        container = self._runs[run_id]
        return await asyncio.wait_for(asyncio.shield(container.ended), timeout_s)

    def has_exited(self, run_id: int) -> bool:
        container = self._runs.get(run_id)
        return container is None or container.ended.done()

    def forget(self, run_id: int) -> None:
        container = self._runs.get(run_id)
        if container is not None and container.ended.done():
            del self._runs[run_id]

    def _spawn(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Delete every container still running, then runsc's state dir."""
        for run_id in list(self._runs):
            self.kill(run_id)
        if self._tasks:  # the watchers and the `runsc delete`s: none outlives the launcher
            await asyncio.wait(self._tasks, timeout=self.kill_grace_s)
        self._runs.clear()
        shutil.rmtree(self.state, ignore_errors=True)


def _remove_runsc_cgroups(name: str) -> None:
    """runsc makes the container's group in every controller; the run's own groups (memory,
    pids) are the verifier's to remove, the other controllers' parents are ours."""
    for controller in CGROUP_ROOT.iterdir():
        group = controller / "tempered" / name
        with contextlib.suppress(OSError):
            (group / "sandbox").rmdir()
        if controller.name not in CGROUP_CONTROLLERS:
            with contextlib.suppress(OSError):
                group.rmdir()


class GVisorBackend(VerifierBackend):
    """Runs each program in a fresh checker (on this host) / gVisor candidate pair."""

    name = "gvisor"

    def __init__(self, config: GVisorSettings | None = None, warm: int = WARM) -> None:
        config = config or GVisorSettings()
        self.python, self.platform = config.python, config.platform
        self.launcher = RunscLauncher(config)
        self.verifier = Verifier(self.launcher, config.python, warm, self.name)
