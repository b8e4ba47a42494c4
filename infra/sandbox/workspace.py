"""Runs one shell command over a workspace directory: a fresh bubblewrap sandbox per command.

    runner = CommandRunner()
    result = await runner.run(
        "python3 -m unittest -q", Mounts(workspace=Path("/var/ws/7"), workdir="/app"),
        uid=session_uid(7), limits=SandboxLimits(), name="w7",
    )
    result.exit_code, result.stdout, result.status      # ExecStatus: passed = exit status 0

The confinement is the local backend's (`infra/sandbox/local.py`): the command runs under its
own uid (no host account owns it; RLIMIT_NPROC counts only its processes), in its own cgroups
(memory, pids; `cgroups.py`), in a bwrap sandbox with every namespace unshared (no network at
all), every capability dropped, no nested user namespaces, the host's /usr, /bin and /lib* read
only (`local.root_binds`), a private size-limited /tmp and /dev/shm (/dev itself read-only:
its tmpfs had half the host's memory, which a command filled past its memory limit where
there are no cgroups), and `--die-with-parent`: when the
worker dies, the sandbox dies with it. bwrap loads the candidate's seccomp filter
(`confine.seccomp_filter`, from a memfd): no kernel keyrings (kept per uid, and a slot's uid
serves one session after another: a key would pass from one episode to the next), no user
namespaces, clone3 ENOSYS (the C library falls back to clone), no other architecture (a 32-bit
binary is killed). ptrace passes: the candidate refuses it only because its program is pid 1,
and a shell's debuggers need it (gdb, strace, LeakSanitizer). The workspace is bound
read-write at `workdir` (and extra trees read-only or read-write where a verifier wants them:
Harbor's /tests, /logs/verifier, /solution), so what the command changes there is what the
next step sees. Limits: wall time (the whole sandbox is killed at the deadline; a verifier's
script's deadline counts its own time, as the functions check's does: `workspace_deadline.py`),
CPU time, file size and processes (rlimits set by the launching /bin/sh, dash or bash:
`PROCESSES_FLAG`), memory (the cgroup), output (captured up to `limits.output_bytes` per
stream, the rest drained).

bwrap reports on a status fd once the sandbox is up and again with the command's exit code,
so a sandbox that never came up is a platform fault (`SandboxNotUp`, a `SandboxInfraError`),
never a result (`workspace_result.py` reads what it reported). A host without bwrap (or, for a root worker, setpriv) cannot run any command:
`missing` says so. Nor can one whose bwrap may not create the namespaces it asks for
(unprivileged user namespaces disabled, a seccomp profile, a container without the
capabilities): `probe` runs `true` through `run`, as a step, and returns bwrap's own error,
where it is one no retry mends (`infra/sandbox/probe.py`; a resource shortage or a slow host
is no verdict). The sandbox worker asks once at start and then serves no workspace sessions
(workers/sandbox.py) rather than fail each step with a retried platform fault.

Not covered: a disk quota on the workspace (the session host's: `infra/environments/mounts.py`),
images (the host's system is the sandbox's root file system).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from contracts.task import SandboxLimits
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.cgroups import MB, Cgroups
from infra.sandbox.confine import seccomp_filter
from infra.sandbox.judge import starvation_fault
from infra.sandbox.launcher import candidate_rlimits
from infra.sandbox.local import root_binds
from infra.sandbox.process import KILL_GRACE_S, Capture
from infra.sandbox.sealed import SEALED_DIR, sealed_shells
from infra.sandbox.workspace_deadline import CpuWaits, wait_out
from infra.sandbox.workspace_result import (  # theirs too: the runner's results and faults
    CommandResult,
    SandboxNotUp,
    command_result,
    status_messages,
)

SESSION_UID_BASE = 10_000_000
"""Workspace uids are SESSION_UID_BASE + pid·SLOTS + slot: unique per live worker process (of
one pid namespace), above the local backend's range (`local.SANDBOX_UID_RANGE`), owned by no
host account. Every pid has its own SLOTS: SLOTS · 2^22 (Linux's largest pid_max) fits a uid,
where the verifier's larger blocks do not (`forkserver.worker_uids` claims one instead)."""
SLOTS = 512
"""Workspace uids (sessions and verifier runs) one worker holds at once."""
PID_1 = '{shell} -c "$1"; exit $?'
"""Pid 1 of the sandbox (`--as-pid-1`: no bwrap init that the host's init would have to reap):
a shell that runs the command as its child and exits with its status. The command is never
pid 1 itself, to which the kernel does not deliver SIGXCPU: a command past its CPU time would
get only the SIGKILL a second later, and an exit by SIGKILL says nothing of why."""
FIRST_VICTIM = 'echo 1000 > /proc/self/oom_score_adj && exec "$@"'
"""What pid 1 runs first, as the host's /bin/sh, then becomes `PID_1`'s shell: it makes itself
and the command the first victims of an OOM kill (`OOM_SPARED`). Not `PID_1`'s own: a sealed
shell (execute-only) is not dumpable, and its /proc/self files are root's."""
OOM_SPARED = "{ echo -17 > /proc/self/oom_adj || :; } 2> /dev/null"
"""What a root worker's launching shell runs before it becomes setpriv, then bwrap. bwrap's
outer process is in the command's memory cgroup, and an OOM kill there must not pick it (a
file in /dev/shm is in no process's rss, so bwrap was often the largest): its pid-1 child,
orphaned to the host's init, stayed a zombie under the slot's uid. With CAP_SYS_RESOURCE this
makes bwrap's oom_score_adj -1000, never picked; the legacy file leaves oom_score_adj_min as it
was (oom_score_adj would set it to -1000 too), so nothing in the sandbox can go below the
worker's own. Without it (a container's root may lack it) bwrap keeps the worker's value; pid
1 and the command, at 1000 (`FIRST_VICTIM`: anyone may raise theirs), are picked first, as a
Kubernetes candidate makes itself its node's first victim. A command that lowers its own
again (to the worker's, at most) may get bwrap picked: the zombie, which the host's init
reaps, is then its own doing, its result the same."""
ULIMIT_FLAGS = {
    "RLIMIT_CPU": ("t", 1),
    "RLIMIT_FSIZE": ("f", 512),
    "RLIMIT_CORE": ("c", 512),
    "RLIMIT_NPROC": ("$processes", 1),
    "RLIMIT_AS": ("v", 1024),
}
"""Each rlimit's `ulimit` flag and the bytes in one of its units (1 for seconds and processes),
as every shell started as sh reads them (bash's POSIX mode too: -c and -f in 512 bytes)."""
PROCESSES_FLAG = "{ ulimit -u > /dev/null 2>&1 && processes=u || processes=p; }"
"""Sets $processes to the shell's flag for RLIMIT_NPROC: -u in bash, busybox, ksh and zsh; -p in
dash, which has no -u (bash's -p is the pipe size, which no one can set)."""
WRAPPER_PROCESSES = 2
"""bwrap's outer process and pid 1 count against the command's process limits."""
INNER_UID = 1000
"""The uid the command sees inside its user namespace."""
HIDDEN_PATHS = (
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/proc", "/dev", "/etc", SEALED_DIR,
)  # fmt: skip
"""Where no workspace or tree may be mounted (the sandbox's own system)."""
SYSTEM_FILES = ("/etc/alternatives", "/etc/ld.so.cache", "/etc/localtime")
"""Host files bound read-only when present: alternatives (awk, editor) resolve, the loader is fast."""
BASE_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
    "PYTHONDONTWRITEBYTECODE": "1",
}
"""Every command's environment, before the task's own variables. No bytecode caches: they
would make the workspace's tree digest depend on file times."""
LAUNCH_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
"""The environment of the launching shell (the sandbox's own is `BASE_ENV`, set by bwrap)."""


def session_uid(slot: int, pid: int | None = None) -> int:
    """The uid of workspace slot `slot` of worker `pid` (default: this process)."""
    if not 0 <= slot < SLOTS:
        raise ValueError(f"slot {slot} is outside 0..{SLOTS - 1}")
    return SESSION_UID_BASE + (os.getpid() if pid is None else pid) * SLOTS + slot


def cgroup_name(slot: int, pid: int | None = None) -> str:
    """Cgroup name of a slot: `<pid>-w<slot>`, which `cgroups.sweep_dead_workers` reaps once the
    worker is gone."""
    return f"{os.getpid() if pid is None else pid}-w{slot}"


def workspace_rlimits(limits: SandboxLimits, cgroups: bool) -> dict[str, tuple[int, int]]:
    """A workspace command's rlimits: the sandboxes' rule (`launcher.candidate_rlimits`), its
    processes counting bwrap's two, and with cgroups no address-space cap (any program runs)."""
    return candidate_rlimits(limits, cgroups, processes_overhead=WRAPPER_PROCESSES, space_cap=False)


def ulimit_prelude(rlimits: dict[str, tuple[int, int]]) -> list[str]:
    """`rlimits` as the launching shell's `ulimit` commands. A `ulimit` without -S or -H sets
    both values, so a limit whose two differ (CPU: SIGXCPU, then SIGKILL) takes two commands,
    the soft one first: the kernel refuses a hard limit below the soft one."""
    commands = [PROCESSES_FLAG] if "RLIMIT_NPROC" in rlimits else []
    for name, (soft, hard) in rlimits.items():
        flag, unit = ULIMIT_FLAGS[name]
        if soft == hard:
            commands.append(f"ulimit -{flag} {soft // unit}")
        else:
            commands += [f"ulimit -S -{flag} {soft // unit}", f"ulimit -H -{flag} {hard // unit}"]
    return commands


def check_mount_point(path: str) -> str:
    """`path` if it is an absolute, normal path outside the sandbox's system; else ValueError."""
    if not path.startswith("/") or os.path.normpath(path) != path or path == "/":
        raise ValueError(f"{path!r} is not an absolute, normalised directory below /")
    if any(path == hidden or path.startswith(hidden + "/") for hidden in HIDDEN_PATHS):
        raise ValueError(f"{path!r} lies in the sandbox's system directories")
    return path


@dataclass(frozen=True)
class Mounts:
    """What the sandbox sees besides the host's system: the workspace, bound read-write at
    `workdir` (also the command's working directory), and extra host trees."""

    workspace: Path
    workdir: str = "/app"
    extra: tuple[tuple[Path, str, bool], ...] = ()
    """(host path, sandbox path, writable)."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables added to `BASE_ENV` (a task's ENV)."""
    sealed: bool = False
    """Pid 1 and the shell that runs the command run this worker's execute-only copy of sh, and
    `SEALED_DIR`/bash is its bash (`sealed.py`): no process of the sandbox may rewrite them."""


class CommandRunner:
    """Runs commands in fresh sandboxes; one instance serves many concurrent commands."""

    def __init__(self) -> None:
        self.bwrap = shutil.which("bwrap")
        self.setpriv = shutil.which("setpriv")
        self.root = os.geteuid() == 0
        self.use_cgroups = Cgroups.available()
        try:
            self.seccomp, self.no_seccomp = seccomp_filter(allow_ptrace=True), ""
        except OSError as exc:  # an architecture without one
            self.seccomp, self.no_seccomp = b"", str(exc)

    @property
    def missing(self) -> str:
        """Why no command can run on this host (a binary not on PATH, no seccomp filter for its
        architecture), or "" when none is missing: the same every time, so a configuration
        fault, not a transient one."""
        if not self.bwrap:
            return "bwrap is missing (install bubblewrap on the sandbox worker's host)"
        if self.root and not self.setpriv:
            return "running as root needs setpriv to drop to a sandbox uid (util-linux)"
        return self.no_seccomp

    def probe(self, directory: Path | None = None, slot: int = SLOTS - 1, **options: Any) -> str:
        """Why no command can run on this host ("" when one can, or no verdict): a start-up
        check of this runner's own sandbox (`infra/sandbox/probe.py`; `options` are its
        keywords: timeout_s, pause_s, limits). Blocks."""
        from infra.sandbox.probe import probe  # it builds on this module

        return probe(self, directory, slot, **options)

    def argv(
        self, command: str, mounts: Mounts, uid: int, limits: SandboxLimits,
        cgroups: Cgroups | None, status_fd: int, seccomp_fd: int | None = None,
        joins: Sequence[Path] = (),
    ) -> list[str]:  # fmt: skip
        """[shell: join cgroups, spare bwrap from OOM kills, set rlimits] → setpriv to `uid` →
        bwrap → /bin/sh -c command.
        `seccomp_fd` holds `self.seccomp` for bwrap to read (none only where `missing` says why);
        `joins`: the `cgroup.procs` of more groups to join (`CpuWaits.procs_files`)."""
        if (missing := self.missing) or not self.bwrap:
            raise SandboxInfraError(missing)
        if seccomp_fd is None:
            raise ValueError("a workspace sandbox needs its seccomp filter's file descriptor")
        binds = ["--bind", str(mounts.workspace), check_mount_point(mounts.workdir)]
        for host, inside, writable in mounts.extra:
            binds += ["--bind" if writable else "--ro-bind", str(host), check_mount_point(inside)]
        for path in SYSTEM_FILES:
            binds += ["--ro-bind-try", path, path]
        shell = "/bin/sh"
        if mounts.sealed:
            binds += ["--ro-bind", str(sealed_shells()), SEALED_DIR]
            shell = f"{SEALED_DIR}/sh"
        env = [arg for key, value in {**BASE_ENV, **mounts.env}.items()
               for arg in ("--setenv", key, value)]  # fmt: skip
        sandbox = [
            self.bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
            "--uid", str(INNER_UID), "--gid", str(INNER_UID), "--cap-drop", "ALL",
            "--die-with-parent", "--new-session", "--as-pid-1", "--hostname", "sandbox", *root_binds(),
            "--proc", "/proc", "--dev", "/dev", "--size", str(limits.tmpfs_mb * MB),
            "--tmpfs", "/dev/shm", "--remount-ro", "/dev", "--size", str(limits.tmpfs_mb * MB),
            "--tmpfs", "/tmp", *binds, "--chdir", mounts.workdir, "--remount-ro", "/",
            "--json-status-fd", str(status_fd), "--seccomp", str(seccomp_fd), "--clearenv", *env,
            "/bin/sh", "-c", FIRST_VICTIM, "sandbox",
            shell, "-c", PID_1.format(shell=shell), "sandbox", command,
        ]  # fmt: skip
        if self.root and self.setpriv:
            drop = [self.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--nnp"]
            sandbox = drop + sandbox
        if cgroups is not None:  # cpuacct too, at once: its count judges a CPU kill (`cpu_used`)
            counted = [cgroups.cpuacct / "cgroup.procs"] if cgroups.cpuacct is not None else []
            joins = [*cgroups.procs_files(), *counted, *joins]
        prelude = [f"echo $$ > {shlex.quote(str(procs))}" for procs in joins]
        prelude += [OOM_SPARED] if self.root else []
        prelude += ulimit_prelude(workspace_rlimits(limits, cgroups is not None))
        return ["/bin/sh", "-c", " && ".join(prelude) + ' && exec "$@"', "sandbox", *sandbox]

    async def run(
        self, command: str, mounts: Mounts, uid: int, limits: SandboxLimits, name: str,
        own_time: bool = False,
    ) -> CommandResult:  # fmt: skip
        """Run `command` (by /bin/sh -c) over `mounts` as `uid`, in cgroups named `name`; a
        sandbox that never came up raises `SandboxNotUp`. `own_time` (a verifier's script,
        whose timeout is a score): the deadline counts the command's own time, not what the
        host kept it waiting for a CPU, and a host that starved it raises SandboxInfraError
        (`workspace_deadline.py`)."""
        cgroups = Cgroups.create(name) if self.use_cgroups else None
        waits: CpuWaits | None = None
        try:
            if cgroups is not None:
                cgroups.apply(limits, processes_overhead=WRAPPER_PROCESSES)
            waits = CpuWaits(cgroups) if own_time and cgroups is not None else None
            return await self._run(command, mounts, uid, limits, cgroups, waits)
        finally:
            if cgroups is not None:
                await cgroups.reap()
            if waits is not None:
                waits.close()

    async def _run(
        self, command: str, mounts: Mounts, uid: int, limits: SandboxLimits,
        cgroups: Cgroups | None, waits: CpuWaits | None,
    ) -> CommandResult:  # fmt: skip
        status_r, status_w = os.pipe()
        seccomp = -1
        try:
            seccomp = os.memfd_create("seccomp")  # bwrap reads it from its offset to its end
            os.write(seccomp, self.seccomp)
            os.lseek(seccomp, 0, os.SEEK_SET)
            joins = waits.procs_files() if waits is not None else []
            argv = self.argv(command, mounts, uid, limits, cgroups, status_w, seccomp, joins)
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(status_w, seccomp),
                start_new_session=True,
                env=LAUNCH_ENV,
            )
        except BaseException as exc:  # nothing started: nothing will write to `status_r`
            os.close(status_r)
            if isinstance(exc, OSError):
                raise SandboxNotUp(f"cannot start the workspace sandbox: {exc}") from exc
            if isinstance(exc, ValueError):  # a NUL byte: the caller's input, on every try
                raise ValueError(
                    f"cannot start the workspace sandbox: {exc} in its command, paths or variables"
                ) from exc
            raise  # e.g. `argv`'s SandboxInfraError: no bwrap here
        finally:
            os.close(status_w)
            if seccomp >= 0:
                os.close(seccomp)
        status = asyncio.StreamReader()
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(status), os.fdopen(status_r, "rb", 0)
        )
        stdout = Capture(limits.output_bytes, name="stdout")
        stderr = Capture(limits.output_bytes, name="stderr")
        assert process.stdout and process.stderr
        readers = asyncio.gather(
            stdout.drain(process.stdout), stderr.drain(process.stderr), status.read()
        )
        started, deadline = time.monotonic(), ""
        try:
            deadline = await wait_out(process, limits, waits)
        finally:
            try:
                await _kill(process, cgroups)
                duration_ms = int((time.monotonic() - started) * 1000)
                *_, reported = await asyncio.wait_for(readers, KILL_GRACE_S)
            except TimeoutError as exc:  # a process outside our reach holds the pipes
                readers.cancel()
                raise SandboxInfraError("the workspace sandbox did not die after SIGKILL") from exc
            finally:
                transport.close()
        event = cgroups.memory_event() if cgroups is not None else ""
        if event == "global":
            raise SandboxInfraError("the host ran out of memory (a global OOM kill)")
        if deadline == "starved":
            raise starvation_fault(limits)
        messages = status_messages(reported)
        oom, code, timed_out = event == "limit", process.returncode, deadline != ""
        gave_away = waits.gave_away if waits is not None else ""
        return command_result(
            messages,
            timed_out,
            oom,
            limits,
            duration_ms,
            stdout,
            stderr,
            code,
            gave_away,
            cpu_used=cgroups.cpu_used() if cgroups is not None else None,
            reached=event == "reached",
        )


async def _kill(process: asyncio.subprocess.Process, cgroups: Cgroups | None) -> None:
    """Kill the sandbox from the inside out, so bwrap reaps its own children: every process
    but bwrap (its cgroups' members, or its descendants), then bwrap once it has exited by
    itself or after a grace period. Killing bwrap first would orphan its pid-1 init to the
    host's init, which may leave it a zombie under the sandbox uid (so no OOM kill picks bwrap
    either: `OOM_SPARED`)."""
    if process.returncode is None:
        inside = set(cgroups.pids()) if cgroups is not None else set()
        with contextlib.suppress(psutil.Error):
            inside |= {child.pid for child in psutil.Process(process.pid).children(recursive=True)}
        for pid in inside - {process.pid}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), KILL_GRACE_S / 2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    try:
        await asyncio.wait_for(process.wait(), KILL_GRACE_S)
    except TimeoutError as exc:
        raise SandboxInfraError("the workspace sandbox did not die after SIGKILL") from exc
