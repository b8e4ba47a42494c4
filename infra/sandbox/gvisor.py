"""The `gvisor` sandbox backend: the two-process verifier with each candidate in a gVisor container.

    backend = GVisorBackend(load_settings().sandbox.gvisor)   # or get_backend(settings)
    result = await backend.run(program, tests, limits, entry_point, task.helpers, task.hidden_tests)
    # SandboxInfraError where runsc cannot work (not installed, not root, kernel says no)
    why = backend.probe()      # "" or why no container comes up here (blocks; the worker's start)

The checker is the local backend's (a fork of the checker zygote on this host, `verifier.py`);
only the candidate differs: `RunscLauncher` starts a fresh OCI container per run (`runsc run`,
network none, `settings.sandbox.gvisor.platform`, ptrace by default) whose only process is the
candidate zygote, under the run's uid and in its cgroups, with no network, no capabilities and
no writable path but one tmpfs at /dev/shm, /tmp a link to it (its bundle: `gvisor_oci.py`). runsc
passes only stdio, so the calls arrive on the container's stdin, the replies leave on its
stdout, and the program's stdout and stderr both reach the result's `stdout`.

The sandbox's group holds gVisor's own kernel too (`SENTRY_MEMORY_MB` more), so the program is
held to `memory_mb` by its address-space cap (`launcher.candidate_space_mb`, held: memory + 64
MiB, as a Kubernetes pod's), and its files by their tmpfs, on top, of `tmpfs_mb` but at most
`memory_mb` (`launcher.candidate_tmpfs_mb`; locally both count against `memory_mb`, and the cap
counts no file: a program of 64 MB kept 200 MB in a /tmp of 256 MB here; the verifier's warm
pool is keyed by that size); its CPU time and its wait for a CPU are its sandbox's
(`Cgroups.cpu_wait`, the `Exit`'s CPU seconds), as no host process is the program's own.
Its processes are held to `max_processes` inside gVisor (RLIMIT_NPROC: a fork fails with
EAGAIN); the group's pids limit bounds gVisor's own host tasks on top (`sentry_tasks`: under
ptrace, quadratic in the program's processes), so a sandbox that reaches it ran out of host
tasks by gVisor's doing, never the program's: a platform fault (its Sentry panics).
`runsc run` dies with the worker (PR_SET_PDEATHSIG, by setpriv; runsc then kills its sandbox),
and a dead worker's bundles and state dirs are swept with its cgroups (`WORKER_DIRS`,
`cgroups.sweep_dead_workers`). The first start of a launcher runs one probe container
(`probe_runsc`): a runsc that cannot run one here (a platform this runsc does not know, or
whose containers never come up) refuses every run at once, in runsc's words.

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
import logging
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path

from contracts.task import SandboxLimits
from infra.sandbox.base import SandboxInfraError, VerifierBackend
from infra.sandbox.cgroups import CGROUP_CONTROLLERS, CGROUP_ROOT, WORKER_DIRS, Cgroups
from infra.sandbox.gvisor_oci import write_bundle
from infra.sandbox.judge import Exit
from infra.sandbox.launcher import CandidateSpec
from infra.sandbox.probe import NO_VERDICT
from infra.sandbox.verifier import Verifier
from infra.sandbox.verifier_job import START_TIMEOUT_S
from infra.settings import GVisorSettings

WARM = 2
"""Containers started ahead per tmpfs size (`candidate_tmpfs_mb`; ~0.2-0.5 s each, ~30 MB idle)."""
SENTRY_MEMORY_MB = 256
"""Memory of gVisor's own kernel (Sentry) and gofer on top of the program's limit."""
SENTRY_THREADS = 64
"""The Sentry's threads beyond one per task of the program and one per CPU (47 measured: 80
threads for 33 busy tasks on 2 CPUs)."""
HOST_TASKS_BASE = 64
"""Host tasks of a sandbox whatever its program does: the gofer's threads (18 measured)."""
OUT_OF_TASKS = "the gVisor sandbox ran out of host tasks (its limit: `gvisor.sentry_tasks`)"
EXITING = re.compile(r"Exiting with status: (\d+)")
SANDBOX_DIED = "Will try waiting on the sandbox process instead"
"""What runsc logs when the wait RPC to the sandbox failed: the sandbox itself is gone."""
BUNDLES, STATES = WORKER_DIRS
"""Prefixes of a container's bundle and of a launcher's runsc state dir (then the worker's pid)."""
RUNSC_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
PROBE_TIMEOUT_S = START_TIMEOUT_S
"""How long the probe container may take to run (~0.5 s; runsc on a platform that cannot work
here may wait for ever, silent: kvm where KVM does not run)."""
PROBE_TRIES = 2
"""Tries that must all fail (runsc's error, or no container in time) before runsc is refused."""
PROBE_PAUSE_S = 1.0
"""The wait before the next try after a shortage (no verdict: `probe.NO_VERDICT`)."""
PROBE_UID = 65534
"""The probe container's user (nobody): it runs `print`, nothing of a job."""
GLOG_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ [\w.]+:\d+\] ", re.M)
"""The header of runsc's log lines on stderr ("W1207 01:38:01.322980  14153 util.go:64] ")."""
logger = logging.getLogger(__name__)


def sentry_tasks(max_processes: int, cpus: int) -> int:
    """The most host tasks (threads) a gVisor sandbox runs under ptrace for a program of
    `max_processes` (RLIMIT_NPROC holds it there inside gVisor, the candidate one more): the
    Sentry's threads, T = the program's tasks + `SENTRY_THREADS` + `cpus` (a task in the
    program's code holds one); a stub process per address space (two for a task mid-exec),
    kept for reuse, with up to two threads (running, mapping) per Sentry thread that ran it;
    the stub master's, one per Sentry thread that made a stub. Quadratic: pids.peak measured on
    2 CPUs, 45 idle, 179 / 364 / 1037 for 8 / 16 / 32 children reading a file for 2 s, 2765
    for 32 reading, mapping and sleeping for 15 s, 3027 for 32 exec'ing in a loop (the bound at
    32: ~13400); 256 on top of the program's made a 12-child program's Sentry panic."""
    tasks = max_processes + 1
    threads = tasks + SENTRY_THREADS + cpus
    return HOST_TASKS_BASE + 2 * threads + 1 + 2 * tasks * (1 + 2 * threads)


def probe_once(
    runsc: str, setpriv: str, platform: str, python: str, timeout_s: float
) -> str | None:
    """One try of the probe: a container that prints "up" with `python`, as a candidate's
    would, under its own state dir (`STATES`) and groups (`<pid>-probe-...`), both swept if the
    worker dies meanwhile; killed at `timeout_s`, its container is deleted. "" if it
    ran, None if it did not in `timeout_s` (killed), else why not in runsc's words."""
    root = Path(tempfile.mkdtemp(prefix=f"{STATES}{os.getpid()}-probe-"))
    # its groups are a run's (`<pid>-probe-...` under `tempered`), which the sweep of a dead
    # worker covers; without a cgroupsPath runsc made `probe` at each controller's root, and a
    # killed probe left those for good. The name is the container's id too: runsc names the
    # sandbox's control socket (abstract, host-wide) after it, so two probes at once with one
    # id failed, "address already in use"
    name = root.name.removeprefix(STATES)
    state = ["--root", str(root / "state")]
    try:
        args = [python, "-S", "-I", "-c", "print('up')"]
        write_bundle(root, python, CandidateSpec(PROBE_UID, 8, Cgroups.named(name)), args)
        argv = [setpriv, "--pdeathsig", "KILL", runsc, *state]
        argv += ["--network=none", f"--platform={platform}", "run", "--bundle", str(root), name]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, env=RUNSC_ENV, check=False
        )
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [runsc, *state, "delete", "--force", name],
                capture_output=True,
                timeout=PROBE_TIMEOUT_S,
                env=RUNSC_ENV,
                check=False,
            )
        return None
    except OSError as exc:
        return f"cannot start runsc: {exc}"
    finally:
        shutil.rmtree(root, ignore_errors=True)
        _remove_groups(name)
    if done.returncode == 0 and done.stdout == "up\n":
        return ""
    lines = [line.strip() for line in GLOG_PREFIX.sub("", done.stderr).splitlines()]
    # runsc logs its fatal error, then prints it again: each line once
    kept = [line for at, line in enumerate(lines) if not any(line in seen for seen in lines[:at])]
    said = " ".join(" ".join(kept).split())[-1000:]
    return said or f"exit status {done.returncode}, stdout {done.stdout[-200:]!r}"


def _remove_groups(name: str) -> None:
    """Remove the empty groups `name` (and those below it) under each controller's `tempered`
    folder; one still in use stays, for `cgroups.sweep_dead_workers`."""
    for path in CGROUP_ROOT.glob(f"*/tempered/{name}"):
        for below in sorted(path.rglob("*"), reverse=True):
            with contextlib.suppress(OSError):  # a control file, or a group in use
                below.rmdir()
        with contextlib.suppress(OSError):
            path.rmdir()


def probe_runsc(runsc: str, setpriv: str, platform: str, python: str) -> str:
    """Why runsc runs no container here with `platform` ("" when it does, or no verdict,
    logged): each of `PROBE_TRIES` tries of `probe_once` failed with runsc's own error or ran
    nothing within `PROBE_TIMEOUT_S`, both the same at every run (a platform this runsc does not
    know, one whose containers never come up, an interpreter missing from the container). A
    shortage (`probe.NO_VERDICT`: EAGAIN, ENOMEM, ...) is no verdict: it may pass. Blocks."""
    failures: list[str | None] = []
    for _ in range(PROBE_TRIES):
        if failures and failures[-1] is not None:
            time.sleep(PROBE_PAUSE_S)
        outcome = probe_once(runsc, setpriv, platform, python, PROBE_TIMEOUT_S)
        if outcome == "":
            return ""
        failures.append(outcome)
        if outcome is not None and not _shortage(outcome):
            break  # runsc said why: the same on every try
    said = [f"no container came up in {PROBE_TIMEOUT_S:g} s" if f is None else f for f in failures]
    if any(failure is not None and _shortage(failure) for failure in failures):
        logger.warning("gVisor probe: no verdict (%s); serving runs", "; ".join(said))
        return ""
    return f"runsc cannot run a container here with --platform={platform}: {said[-1]}"


def _shortage(said: str) -> bool:
    return any(words in said.lower() for words in NO_VERDICT)


@dataclass
class _Container:
    name: str
    bundle: Path
    cgroups: Cgroups | None
    process: asyncio.subprocess.Process
    ended: asyncio.Future[Exit]
    killing: bool = False


class RunscLauncher:
    """Starts each candidate as a fresh gVisor container (see the module doc)."""

    sigkill_is_foreign = False
    """The program can SIGKILL itself in gVisor; a dead sandbox is reported as a fault."""
    memory_overhead_mb = SENTRY_MEMORY_MB
    exit_grace_s = 3.0
    kill_grace_s = 10.0

    def __init__(self, config: GVisorSettings) -> None:
        self.python, self.platform = config.python, config.platform
        self.processes_overhead = sentry_tasks(
            SandboxLimits().max_processes, len(os.sched_getaffinity(0))
        )
        """gVisor's own host tasks on top of the program's limit (the verifier adds one sum for
        every run: sized for the default limit, past which a busy program may exhaust it)."""
        self.runsc, self.setpriv = shutil.which("runsc"), shutil.which("setpriv")
        self.state = Path(tempfile.gettempdir()) / f"{STATES}{os.getpid()}-{secrets.token_hex(4)}"
        """runsc's state dir for this launcher's containers, removed by `close`."""
        self._runs: dict[int, _Container] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._probed: str | None = None
        """The probe container's verdict (`probe_runsc`), once it ran: it holds for good."""

    @property
    def alive(self) -> bool:
        return self.runsc is not None

    def probe(self) -> str:
        """Why this launcher can start no container ("" when it can, or no verdict): runsc or
        setpriv missing, not root, or the probe container's verdict (`probe_runsc`, run once
        per launcher: a runsc that cannot run one is refused for good). Blocks."""
        if not self.runsc:
            return "runsc is not installed (scripts/setup-system.sh installs it)"
        if not self.setpriv:
            return "setpriv is not installed (util-linux; scripts/setup-system.sh installs it)"
        if os.geteuid() != 0:
            return "the gvisor backend runs containers as root (runsc run)"
        if self._probed is None:
            self._probed = probe_runsc(self.runsc, self.setpriv, self.platform, self.python)
        return self._probed

    async def start(self) -> None:
        if why := await asyncio.to_thread(self.probe):
            raise SandboxInfraError(why)

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
        bundle = Path(tempfile.mkdtemp(prefix=f"{BUNDLES}{os.getpid()}-"))
        name = f"tempered-{os.getpid()}-{run_id}-{secrets.token_hex(4)}"
        assert self.setpriv is not None  # `start` refuses without it
        try:
            write_bundle(bundle, self.python, spec)
            debug = ["--debug", "--debug-command=run", f"--debug-log={bundle}/log/"]
            # SIGKILLed when this thread (the event loop's) ends: a dead worker's container
            # dies with it, as an attached runsc kills its sandbox when it dies
            pdeathsig = [self.setpriv, "--pdeathsig", "KILL"]
            process = await asyncio.create_subprocess_exec(
                *pdeathsig,
                *self._runsc(*debug, "run", "--bundle", str(bundle), name),
                stdin=calls,
                stdout=replies,
                stderr=out,
                start_new_session=True,
                env=RUNSC_ENV,
            )
        except OSError as exc:
            shutil.rmtree(bundle, ignore_errors=True)
            raise SandboxInfraError(f"cannot start runsc: {exc}") from exc
        ended = asyncio.get_running_loop().create_future()
        container = _Container(name, bundle, spec.cgroups, process, ended)
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
        if container.cgroups is not None and container.cgroups.process_limit_reached():
            fault = OUT_OF_TASKS  # gVisor's own: RLIMIT_NPROC holds the program inside
        shutil.rmtree(container.bundle, ignore_errors=True)
        cpu_s = 0.0  # the sandbox's CPU since the run's start: the program has no process here
        if container.cgroups is not None:
            cpu_s = container.cgroups.cpu_used() or 0.0  # before runsc's groups go
            _remove_runsc_cgroups(container.cgroups.name)
        if not container.ended.done():
            container.ended.set_result(Exit(status, cpu_s, fault))

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
        self.verifier = Verifier(self.launcher, config.python, warm, self.name, own_kernel=True)

    def probe(self) -> str:
        """Why this host runs no gVisor container ("" when it does, or no verdict): the
        launcher's probe (`RunscLauncher.probe`), for a worker to refuse at its start. Blocks."""
        return self.launcher.probe()
