"""What the verifier needs of the sandbox its candidates run in: the `CandidateLauncher` Protocol.

    launcher = ForkServer("candidate", candidate_zygote_argv(...))     # local.py
    launcher = RunscLauncher(settings.sandbox.gvisor)                 # gvisor.py
    verifier = Verifier(launcher)

A launcher starts one candidate per run, confined as a `CandidateSpec` says, holding exactly
the fds it is given, and reports how it ended (`judge.Exit`); `candidate_rlimits` are the
limits every candidate sets on itself before the program runs (and the rule of every other
sandbox's: a Kubernetes pod's candidate, a workspace command).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from contracts.task import SandboxLimits
from infra.sandbox.cgroups import MB, Cgroups
from infra.sandbox.judge import Exit


@dataclass(frozen=True)
class CandidateSpec:
    """What a launcher needs to start one run's candidate."""

    uid: int
    tmpfs_mb: int
    cgroups: Cgroups | None


class CandidateLauncher(Protocol):
    """Starts one candidate per run (the local backend's candidate `ForkServer`, gVisor's
    `RunscLauncher`) with fds [calls (read), replies (write), stdout, stderr] and reports how
    it ended. `kill` must end everything the candidate started."""

    sigkill_is_foreign: bool
    """Whether a SIGKILL can only come from outside the candidate's sandbox (see judge.py)."""
    memory_overhead_mb: int
    """Memory the sandbox itself needs on top of the program's limit (gVisor's kernel)."""
    processes_overhead: int
    """Processes the sandbox itself runs on top of the program's limit."""
    exit_grace_s: float
    """How long a candidate that closed its channel may take to end by itself."""
    kill_grace_s: float
    """How long a killed candidate may take to go away before that is a platform fault."""

    @property
    def alive(self) -> bool: ...

    async def start(self) -> None: ...

    async def fork(self, run_id: int, spec: CandidateSpec, fds: list[int]) -> int | None: ...

    def kill(self, run_id: int) -> None: ...

    async def exited(self, run_id: int, timeout_s: float) -> Exit: ...

    def has_exited(self, run_id: int) -> bool: ...

    def forget(self, run_id: int) -> None: ...

    async def close(self) -> None: ...


HELD_SPACE_SLACK_MB = 64
"""Address space a candidate whose sandbox holds all it maps (`candidate_space_mb`) has beyond
its memory limit: the interpreter's own mappings (~14 MB) and a few threads' stacks (each
thread's, there, is `zygote.SERVED_THREAD_STACK`, not glibc's 8 MiB)."""


def candidate_space_mb(limits: SandboxLimits, held: bool = False) -> int:
    """The address-space cap of a candidate whose memory cgroups bound. Generous, 2 x memory +
    256 MiB: an absurd allocation fails fast with a MemoryError (the program's `error`: no
    memory was used, the limit never hit, `judge.unproven_memory`), and runtimes that reserve more
    than they touch still run; the cgroup stops the rest, and the host reads its events. Or
    `held`, memory + HELD_SPACE_SLACK_MB: where the cgroup's kill cannot be told apart from the
    sandbox's own death, so one process must never map more than its sandbox is sized to hold
    (a Kubernetes pod, `kubernetes_job.pod_memory_mb`: under gVisor no OOM killer runs inside
    the sandbox, and the host's ends the whole pod, launcher and result line with it), or where
    the cgroup holds more than the program's memory (the gvisor backend's: gVisor's own kernel,
    `gvisor.SENTRY_MEMORY_MB` on top), so only this cap holds the program to its limit."""
    if held:
        return limits.memory_mb + HELD_SPACE_SLACK_MB
    return 2 * limits.memory_mb + 256


def candidate_tmpfs_mb(limits: SandboxLimits, held: bool = False) -> int:
    """The size of a candidate's one tmpfs (its /tmp and /dev/shm): `tmpfs_mb`, or, `held`,
    where only the address-space cap holds the program to `memory_mb` (`candidate_space_mb`'s
    held: the gvisor backend's sandbox, whose cgroup holds gVisor's kernel beside the program,
    files in gVisor's tmpfs included), at most `memory_mb` too: files are no mapping the cap
    counts, and locally the memory cgroup charges them (shmem) against `memory_mb`, so a program
    of 64 MB keeping 200 MB in a /tmp of 256 MB would pass there alone. The verifier keys its
    warm pool by this size: runs whose `memory_mb` is at least `tmpfs_mb` (the defaults) share
    one."""
    return min(limits.tmpfs_mb, limits.memory_mb) if held else limits.tmpfs_mb


def candidate_rlimits(
    limits: SandboxLimits,
    cgroups: bool,
    nproc: bool = True,
    *,
    processes_overhead: int = 1,
    space_cap: bool = True,
    space_held: bool = False,
) -> dict[str, tuple[int, int]]:
    """The rlimits of every sandbox, in setrlimit's terms: a host candidate sets them on itself
    before the program runs, a Kubernetes pod's candidate too (`kubernetes_job.sandbox_rlimits`),
    and a workspace command's launching shell as `ulimit` flags (`workspace.ulimit_prelude`).

    CPU: SIGXCPU at `cpu_s` (a timeout), SIGKILL a second later. Processes (`nproc`):
    `max_processes` plus those the sandbox itself runs under the same uid
    (`processes_overhead`: the candidate itself; bwrap's two for a workspace command); off where
    the uid is shared by sandboxes that must not starve each other (Kubernetes). Address space:
    the memory limit itself without cgroups; with them (which bound real memory),
    `candidate_space_mb` (generous, or `space_held`: what the sandbox holds), or none
    (`space_cap` False: a workspace command may be any program, and runtimes that reserve far
    more address space than they touch, a JVM or Go, would fail under one)."""
    file_size = limits.file_size_mb * MB
    rlimits = {
        "RLIMIT_CPU": (limits.cpu_s, limits.cpu_s + 1),
        "RLIMIT_FSIZE": (file_size, file_size),
        "RLIMIT_CORE": (0, 0),
    }
    if nproc:
        rlimits["RLIMIT_NPROC"] = (limits.max_processes + processes_overhead,) * 2
    if not cgroups:
        rlimits["RLIMIT_AS"] = (limits.memory_mb * MB,) * 2
    elif space_cap:
        rlimits["RLIMIT_AS"] = (candidate_space_mb(limits, space_held) * MB,) * 2
    return rlimits
