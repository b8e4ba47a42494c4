"""Host side of the verifier's zygotes: start one in its sandbox, ask it to fork, learn of exits.

    server = ForkServer("candidate", candidate_zygote_argv(python, bwrap, cgroups=True))
    await server.start()
    await server.fork(run_id, CandidateSpec(uid, tmpfs_mb, cgroups), fds)   # checker: None
    server.kill(run_id)
    ended = await server.exited(run_id, timeout_s=2)        # judge.Exit
    await server.close()

A candidate `ForkServer` is the local backend's `CandidateLauncher` (launcher.py); a checker
one serves every backend whose checkers run on this host (local, gVisor).

`zygote.py` is the other half (and documents the control protocol). The checker zygote runs
as the worker's checker uid in an unprivileged bubblewrap sandbox (all namespaces unshared,
read-only root, no network); the candidate zygote runs as root in a privileged bubblewrap
sandbox (no network, read-only root and /dev, the host's `tempered` cgroup folders bound at
/cg, only the capabilities in ZYGOTE_CAPS) because its children make namespaces and change
uid. Both get their code as sources on stdin, read here from this package's own files, and
never open a file the model could write.

Sandbox uids: each worker process claims a block of BLOCK_UIDS uids no host account uses
(`worker_uids`): offset 0 runs its checkers, the others its candidates, one per run in flight.
A block is claimed, not derived from the pid: one per pid would need BLOCK_UIDS · 2^22 uids
(Linux's largest pid_max), past 32 bits, so there are only WORKER_BLOCKS, and while a worker's
block was its pid % WORKER_BLOCKS, two live workers whose pids differed by a multiple of that
shared one. Their candidates could not reach each other's processes or files (a pid namespace
each, ptrace refused, a private /tmp, a read-only root), but the kernel keeps some accounts per
uid: one's processes counted against the other's RLIMIT_NPROC (a fork failed, and the program
with it: a wrong verdict). So a worker claims its pid's
block, else the next free one, by binding an abstract unix socket named for it, which the
kernel frees when the worker ends.

Not covered: restarting a zygote that died (the verifier starts a new one on its next run);
workers that share the host's uids but not its network namespace, where abstract names live
(two sandbox pods on one node): they do not see each other's claims (nor pids, which the
workspaces' uids are made of: `workspace.session_uid`). The kernel's keyrings, also kept per
uid and across runs, are refused by the candidate's seccomp filter (`confine.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import os
import signal
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from infra.sandbox import codec
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.cgroups import CGROUP_ROOT
from infra.sandbox.confine import CGROUP_MOUNTS
from infra.sandbox.judge import Exit
from infra.sandbox.process import KILL_GRACE_S

if TYPE_CHECKING:
    from infra.sandbox.launcher import CandidateSpec

MODULES = ("codec", "confine", "candidate", "checker_calls", "checker")
"""The modules a zygote runs, in load order (each may import the ones before it)."""
START_TIMEOUT_S = 30.0
UID_BASE = 100_000
"""Sandbox uids are UID_BASE + block · BLOCK_UIDS + slot: no host account owns them."""
BLOCK_UIDS = 8192
"""Uids of one worker's block: its checkers' (offset 0) and one per candidate run in flight."""
WORKER_BLOCKS = 512
"""Blocks in all: at most this many verifier workers run on one host at once."""
SANDBOX_UID_RANGE = range(UID_BASE, UID_BASE + WORKER_BLOCKS * BLOCK_UIDS)
BLOCK_CLAIM = "\0tempered-sandbox-uids-{}"
"""The abstract unix socket name that holds a block for its worker (`worker_uids`)."""
SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "MALLOC_ARENA_MAX": "2"}
ENV = ["--clearenv", *(arg for item in SANDBOX_ENV.items() for arg in ("--setenv", *item))]
DEVICES = ("null", "zero", "full", "random", "urandom")
ZYGOTE_CAPS = [
    arg
    for cap in ("SYS_ADMIN", "SETUID", "SETGID", "SETPCAP", "KILL")
    for arg in ("--cap-add", f"CAP_{cap}")
]
"""What the candidate zygote keeps: namespaces and mounts, uid changes, dropping the bounding
set, and killing its children (which run under other uids); bwrap drops the rest."""


_claim: tuple[int, int, socket.socket] | None = None
"""(pid, block, the socket that holds it) of this process's block."""
_claiming = threading.Lock()


def worker_uids() -> range:
    """This worker process's block of sandbox uids, claimed on the first call; SandboxInfraError
    when live workers hold every block."""
    global _claim
    with _claiming:
        pid = os.getpid()
        if _claim is None or _claim[0] != pid:  # a forked child claims its own
            _claim = (pid, *_claim_block(pid))
        start = UID_BASE + _claim[1] * BLOCK_UIDS
    return range(start, start + BLOCK_UIDS)


def _claim_block(pid: int) -> tuple[int, socket.socket]:
    """The first free block from `pid`'s own (pid % WORKER_BLOCKS), and the socket holding it."""
    for step in range(WORKER_BLOCKS):
        block = (pid + step) % WORKER_BLOCKS
        holder = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            holder.bind(BLOCK_CLAIM.format(block))
        except OSError:  # another live worker's
            holder.close()
            continue
        return block, holder
    raise SandboxInfraError(
        f"live workers on this host hold all {WORKER_BLOCKS} blocks of sandbox uids"
    )


ROOT_ENTRIES = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
"""The entries of the host's root a sandbox has as the host has them (`root_binds`), beside /usr."""


def root_binds() -> list[str]:
    """bwrap arguments for a read-only /usr and the /bin, /lib* entries of the host's root."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ROOT_ENTRIES:
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    return args


def sources() -> dict[str, str]:
    """{module name: source} of what a zygote loads, from this package's files."""
    here = Path(__file__).parent
    return {f"infra.sandbox.{name}": (here / f"{name}.py").read_text() for name in MODULES}


def _dev_args() -> list[str]:
    """A read-only /dev with the harmless devices, /dev/fd links and a /dev/shm mount point."""
    args = ["--tmpfs", "/dev"]
    for name in DEVICES:
        args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    links = {"fd": "", "stdin": "/0", "stdout": "/1", "stderr": "/2"}
    for name, fd in links.items():
        args += ["--symlink", f"/proc/self/fd{fd}", f"/dev/{name}"]
    return [*args, "--dir", "/dev/shm", "--remount-ro", "/dev"]


def checker_zygote_argv(python: str, uid: int, bwrap: str, setpriv: str) -> list[str]:
    """setpriv to the checker uid → unprivileged bwrap (everything unshared) → the zygote."""
    drop = f"{setpriv} --reuid={uid} --regid={uid} --clear-groups --nnp".split()
    isolate = (
        f"{bwrap} --unshare-all --unshare-user --disable-userns --uid {uid} --gid {uid} "
        "--cap-drop ALL --die-with-parent --new-session"
    ).split()
    files = f"--proc /proc --size {64 << 20} --tmpfs /tmp --remount-ro /".split()
    zygote = [python, "-S", "-I", "-c", zygote_source(), "checker"]
    return [*drop, *isolate, *root_binds(), *_dev_args(), *files, *ENV, *zygote]


def candidate_zygote_argv(python: str, bwrap: str, cgroups: bool) -> list[str]:
    """Privileged bwrap (root, capabilities kept, no network) → the zygote."""
    binds: list[str] = []
    if cgroups:
        for mount in CGROUP_MOUNTS:
            controller = mount.rsplit("/", 1)[1]
            binds += ["--bind", str(CGROUP_ROOT / controller / "tempered"), mount]
    isolate = f"{bwrap} --unshare-pid --unshare-net --unshare-ipc --unshare-uts".split()
    isolate += [*ZYGOTE_CAPS, "--die-with-parent", "--new-session"]
    files = ["--proc", "/proc", "--dir", "/tmp", *binds, "--remount-ro", "/"]
    zygote = [python, "-S", "-I", "-c", zygote_source(), "candidate"]
    return [*isolate, *root_binds(), *_dev_args(), *files, *ENV, *zygote]


def zygote_source() -> str:
    """The text of zygote.py (its `-c` program)."""
    return (Path(__file__).parent / "zygote.py").read_text()


class ForkServer:
    """One running zygote, driven over its control socket from the event loop."""

    sigkill_is_foreign = True
    """Its candidates are pid 1 of their own pid namespace: nothing inside can SIGKILL them."""
    memory_overhead_mb = 0
    processes_overhead = 1
    """The candidate itself counts against its pids cgroup and RLIMIT_NPROC."""
    exit_grace_s = 0.5
    kill_grace_s = KILL_GRACE_S

    def __init__(self, role: str, argv: list[str]) -> None:
        self.role, self.argv = role, argv
        self.process: asyncio.subprocess.Process | None = None
        self.control: socket.socket | None = None
        self._hello: asyncio.Future[None] | None = None
        self._forked: dict[int, asyncio.Future[int]] = {}
        self._exits: dict[int, asyncio.Future[Exit]] = {}

    @property
    def alive(self) -> bool:
        return (
            self.control is not None
            and self.process is not None
            and self.process.returncode is None
        )

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.process = await asyncio.create_subprocess_exec(
                *self.argv,
                str(theirs.fileno()),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            )
        except OSError as exc:
            ours.close()
            raise SandboxInfraError(f"cannot start the {self.role} zygote: {exc}") from exc
        finally:
            theirs.close()
        assert self.process.stdin is not None
        self.process.stdin.write(marshal.dumps(sources()))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await self.process.stdin.drain()
        self.process.stdin.close()
        ours.setblocking(False)
        self.control, self._hello = ours, loop.create_future()
        loop.add_reader(ours.fileno(), self._readable)
        try:
            await asyncio.wait_for(asyncio.shield(self._hello), START_TIMEOUT_S)
        except (TimeoutError, SandboxInfraError) as exc:
            await self.close()
            raise SandboxInfraError(f"the {self.role} zygote did not start: {exc}") from exc

    def _readable(self) -> None:
        assert self.control is not None
        while True:
            try:
                data = self.control.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._lost()
                return
            self._dispatch(codec.decode(data))

    def _dispatch(self, message: object) -> None:
        if not isinstance(message, tuple) or not message:
            return
        kind, *rest = message
        if kind == "hello" and self._hello and not self._hello.done():
            self._hello.set_result(None)
        elif kind == "forked" and (future := self._forked.pop(rest[0], None)) and not future.done():
            future.set_result(int(rest[1]))
        elif kind == "failed" and (future := self._forked.pop(rest[0], None)) and not future.done():
            future.set_exception(
                SandboxInfraError(f"the {self.role} zygote cannot fork: {rest[1]}")
            )
        elif kind == "exited" and (waiter := self._exits.get(rest[0])) and not waiter.done():
            waiter.set_result(Exit(int(rest[1]), float(rest[2])))

    def _lost(self) -> None:
        """The zygote is gone: its children died with it (PR_SET_PDEATHSIG)."""
        if self.control is not None:
            asyncio.get_running_loop().remove_reader(self.control.fileno())
            self.control.close()
            self.control = None
        error = SandboxInfraError(f"the {self.role} zygote exited")
        for future in [self._hello, *self._forked.values()]:
            if future is not None and not future.done():
                future.set_exception(error)
        lost = Exit(signal.SIGKILL, fault=f"the {self.role} zygote died during the run")
        for waiter in self._exits.values():
            if not waiter.done():
                waiter.set_result(lost)
        self._forked.clear()

    async def fork(self, run_id: int, spec: CandidateSpec | None, fds: list[int]) -> int:
        """Fork a child for `run_id` holding `fds` (a candidate confined as `spec` says); its
        pid in the zygote's pid namespace (`cgroups.host_pid` finds it on the host)."""
        options: dict[str, object] = {}
        if spec is not None:
            group = spec.cgroups.name if spec.cgroups is not None else None
            procs = [f"{mount}/{group}/cgroup.procs" for mount in CGROUP_MOUNTS if group]
            options = {"uid": spec.uid, "tmpfs_mb": spec.tmpfs_mb, "cgroups": procs}
        if not self.alive or self.control is None:
            raise SandboxInfraError(f"the {self.role} zygote is not running")
        future = self._forked[run_id] = asyncio.get_running_loop().create_future()
        self._exits[run_id] = asyncio.get_running_loop().create_future()
        try:
            socket.send_fds(self.control, [codec.encode(("fork", run_id, options))], fds)
        except OSError as exc:
            self._forked.pop(run_id, None)
            raise SandboxInfraError(f"the {self.role} zygote is unreachable: {exc}") from exc
        return await future

    def kill(self, run_id: int) -> None:
        if self.control is not None:
            with contextlib.suppress(OSError):
                self.control.send(codec.encode(("kill", run_id)))

    async def exited(self, run_id: int, timeout_s: float) -> Exit:
        """How the run's child ended; TimeoutError if it is still alive."""
        waiter = self._exits[run_id]
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
        finally:
            if waiter.done():
                self._exits.pop(run_id, None)

    def has_exited(self, run_id: int) -> bool:
        waiter = self._exits.get(run_id)
        return waiter is None or waiter.done()

    def forget(self, run_id: int) -> None:
        self._exits.pop(run_id, None)

    async def close(self) -> None:
        """Close the control socket (the zygote kills its children and exits) and wait."""
        if self.control is not None:
            self._lost()
        if self.process is not None and self.process.returncode is None:
            try:
                await asyncio.wait_for(self.process.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, 9)
                await self.process.wait()
