"""Infrastructure faults after the sandbox is ready are told apart from the program's failure.

Each test starts a real run on the local backend (public API only: `get_backend(settings)`,
`backend.run(program, tests, limits, entry_point)`), waits until the model's program is inside
the function the tests call, then strikes it from the host, as the platform's own faults do
(the host's starvation and the controls run on gVisor too, where it runs here):

- a host-side SIGKILL of the candidate (an operator, the kubelet, a node agent) → infra_error;
- the same for every process of the run, checker included → infra_error;
- a real kernel OOM kill that is not the sandbox's own limit (the candidate moved into a
  tighter cgroup of the test's, standing in for a global OOM: its own limit is never reached)
  → infra_error;
- starvation by the host (the candidate throttled to 1% of a CPU by a cgroup of the test's,
  standing in for the worker's own overload) so its wall-clock deadline passes while it was
  runnable but not run → infra_error;
and, as controls, the program's own failures keep their statuses: over its own memory limit →
memory_exceeded; spinning past its CPU limit → timeout; starving its own answering thread with
threads of its own → timeout; SIGKILLing itself or exiting mid-call → failed or error.
`infra_error`: the run's status, or `SandboxInfraError` raised (retried, never a reward).

The test needs nothing of the backend's insides: the program names itself (`/proc/self/comm`)
so the test can find it among this process's descendants, and waits for SIGUSR1 where the test
must act first (move it into a cgroup). The cgroup cases need root and writable cgroups v1
(`memory`, `cpu`); skipped, with the reason, elsewhere. Each docstring says what must hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox import SandboxBackend, SandboxInfraError, get_backend
from infra.sandbox.cgroups import CGROUP_ROOT, Cgroups
from infra.sandbox.gvisor import GVisorBackend
from infra.settings import Settings
from tests.infra.sandbox.verifier_box import gvisor_missing

pytestmark = [
    pytest.mark.skipif(
        shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bwrap and root"
    ),
    pytest.mark.asyncio,
]

CGROUP_V1 = Path("/sys/fs/cgroup")
INFRA = "infra_error"
CHECK = "def check(candidate):\n    assert candidate(1, 2) == 3\n"
NAMED = (
    'open("/proc/self/comm", "w").write("{mark}")\n'
    "import os, signal, time\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGUSR1}})  # for sigwait (pid 1)\n"
)
FAST = SandboxLimits(timeout_s=10)


def program(mark: str, body: str) -> str:
    """A program that names its process `mark` and whose add(a, b) runs `body` first."""
    indented = textwrap.indent(textwrap.dedent(body).strip(), "    ")
    return NAMED.format(mark=mark) + f"def add(a, b):\n{indented}\n    return a + b\n"


def named(mark: str) -> list[psutil.Process]:
    """This process's descendants named `mark` (by the program itself)."""
    found = []
    for process in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if process.name() == mark:
                found.append(process)
    return found


@pytest.fixture(params=["local", "gvisor"])
def backend(request: pytest.FixtureRequest) -> str:
    """Each backend that runs here, by name (gVisor skipped, with the reason, where it cannot;
    asked here, outside the test's event loop, as its probe runs one of its own)."""
    if request.param == "gvisor" and (reason := gvisor_missing()):
        pytest.skip(reason)
    return str(request.param)


def cold_backend(name: str = "local") -> SandboxBackend:
    """The backend `name` with no warm pool: every process born during a run is its own."""
    settings = Settings()
    settings.sandbox.local.warm = 0
    if name == "gvisor":  # get_backend's keeps a warm pool of its own
        return GVisorBackend(settings.sandbox.gvisor, warm=0)
    return get_backend(settings, name)


async def strike(
    mark: str,
    prog: str,
    limits: SandboxLimits,
    action: Callable[[psutil.Process], None] | None = None,
    backend_name: str = "local",
) -> str:
    """Run `prog`; once its process named `mark` exists, do `action` to it; the outcome. With
    an `action` (a fault), fail unless it was applied to the running program: a run that ends
    first (an infra_error of another cause, say) would pass the test without the fault."""
    backend = cold_backend(backend_name)
    try:
        run = asyncio.create_task(backend.run(prog, CHECK, limits, "add"))
        if action is None:  # a control: the program ends by itself
            return await outcome(run)
        for _ in range(400):
            if found := named(mark):
                await asyncio.sleep(0.3)  # let it enter add() and wait there
                assert not run.done(), f"the run ended before the fault: {await outcome(run)}"
                action(found[0])
                return await outcome(run)
            if run.done():
                pytest.fail(f"the run ended before {mark!r} appeared: {await outcome(run)}")
            await asyncio.sleep(0.05)
        pytest.fail(f"no process named {mark!r} appeared: the program never ran")
    finally:
        await backend.close()


async def outcome(run: asyncio.Task[object]) -> str:
    """The run's status, or "infra_error" for `SandboxInfraError` (both are retried)."""
    try:
        result = await asyncio.wait_for(run, 120)
    except SandboxInfraError:
        return INFRA
    return str(result.status)  # type: ignore[attr-defined]


def mark() -> str:
    return f"tmpd-{uuid.uuid4().hex[:8]}"  # comm holds 15 characters


async def run_alone(body: str, limits: SandboxLimits, backend: str) -> str:
    """The outcome of `program` running `body` on the backend named `backend`, no fault done to
    it: what the program's own doing comes to."""
    name = mark()
    return await strike(name, program(name, body), limits, backend_name=backend)


def writable(controller: str) -> str | None:
    """Why a cgroup v1 `controller` cannot be used here, or None."""
    path = CGROUP_V1 / controller
    if not (path / "cgroup.procs").exists() or not os.access(path, os.W_OK):
        return f"needs a writable cgroup v1 {controller} controller"
    return None


@contextlib.contextmanager
def cgroup(parent: Path, limits: dict[str, str]) -> Iterator[Path]:
    """A cgroup of the test's under `parent` with `limits` (files → values), removed after."""
    path = parent / f"tmpd-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        for name, value in limits.items():
            (path / name).write_text(value)
        yield path
    finally:
        for _ in range(100):  # its processes are dead; the kernel may take a moment to say so
            with contextlib.suppress(OSError):
                path.rmdir()
            if not path.exists():
                break
            time.sleep(0.05)


def memory_cgroup_of(pid: int) -> Path:
    """The cgroup v1 memory directory `pid` is in."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return CGROUP_V1 / "memory" / path.lstrip("/")
    raise AssertionError(f"process {pid} is in no memory cgroup")


def move_and_go(target: Path) -> Callable[[psutil.Process], None]:
    """Action: move the process into `target`, then tell it to go on (SIGUSR1)."""

    def act(process: psutil.Process) -> None:
        (target / "cgroup.procs").write_text(str(process.pid))
        process.send_signal(signal.SIGUSR1)

    return act


# -- the platform's faults: infra_error ------------------------------------------------------


async def test_a_host_sigkill_of_the_candidate_is_an_infra_error() -> None:
    """The candidate is its pid namespace's init: nothing inside the sandbox can SIGKILL it, so
    a SIGKILL the backend did not send (deadline) and no OOM of its own cgroup explains comes
    from the host. Backend: report infra_error for it, not failed."""
    name = mark()
    kill = lambda process: process.send_signal(signal.SIGKILL)  # noqa: E731
    status = await strike(name, program(name, "time.sleep(30)"), SandboxLimits(timeout_s=20), kill)
    assert status == INFRA


async def test_a_host_sigkill_of_the_whole_run_is_an_infra_error() -> None:
    """Every process born for the run (candidate, checker and their launchers; no warm pool,
    and the backend's long-lived processes started by a first run) killed: no verdict ever
    comes. Backend: a run whose trusted checker died without a verdict, when the backend did
    not kill it, is infra_error."""
    name = mark()
    backend = cold_backend()
    try:
        warm_up = await backend.run("def add(a, b):\n    return a + b\n", CHECK, FAST, "add")
        assert warm_up.status == ExecStatus.PASSED, warm_up
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        limits = SandboxLimits(timeout_s=20)
        run = asyncio.create_task(
            backend.run(program(name, "time.sleep(30)"), CHECK, limits, "add")
        )
        while not named(name):
            assert not run.done(), "the program ended before the test could act"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        born = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        assert len(born) >= 2, f"expected a candidate and a checker, found {born}"
        for process in born:
            with contextlib.suppress(psutil.Error):
                process.send_signal(signal.SIGKILL)
        assert await outcome(run) == INFRA
    finally:
        await backend.close()


@pytest.mark.skipif(bool(writable("memory")), reason=str(writable("memory")))
async def test_an_oom_kill_that_is_not_the_sandbox_limit_is_an_infra_error() -> None:
    """A real kernel OOM kill of the candidate in a 48 MB cgroup of the test's, inside its own
    1 GB one, whose limit it never reaches (as in a global OOM). Backend: memory_exceeded only
    when the run's own cgroup reached its limit (v1: memory.failcnt > 0 or max_usage_in_bytes
    at the limit; v2: memory.events `max`/`oom` > 0); an OOM kill without that is
    infra_error."""
    name = mark()
    body = """
        signal.sigwait({signal.SIGUSR1})
        hog = [b"x" * (8 << 20) for _ in range(40)]
    """
    limits = SandboxLimits(timeout_s=20, memory_mb=1024)

    async def run() -> str:
        backend = cold_backend()
        try:
            task = asyncio.create_task(backend.run(program(name, body), CHECK, limits, "add"))
            while not (found := named(name)):
                assert not task.done(), "the program ended before the test could act"
                await asyncio.sleep(0.05)
            own = memory_cgroup_of(found[0].pid)  # the run's cgroup, limit 1 GB
            tight = {"memory.limit_in_bytes": str(48 << 20)}  # no swap here: the limit kills
            try:
                with cgroup(own, tight) as inside:
                    await asyncio.sleep(0.3)
                    move_and_go(inside)(found[0])
                    status = await outcome(task)
                    oom = (inside / "memory.oom_control").read_text().split()
                    assert int(oom[oom.index("oom_kill") + 1]) >= 1, "the kernel killed nothing"
                    return status
            finally:  # the backend could not remove its run cgroup while ours was inside it
                with contextlib.suppress(OSError):
                    own.rmdir()
        finally:
            await backend.close()

    assert await run() == INFRA


@pytest.mark.skipif(bool(writable("cpu")), reason=str(writable("cpu")))
@pytest.mark.usefixtures("short_starvation_bound")
async def test_a_program_starved_of_cpu_by_the_host_is_an_infra_error() -> None:
    """The candidate throttled to 1% of a CPU (a cgroup of the test's) while it computes: its
    wall-clock deadline passes while it was runnable but not run (/proc/<pid>/schedstat's
    run_delay holds nearly all of it). Backend: a deadline is the program's fault only when it
    used the time (CPU, or blocked by itself); one spent waiting for a CPU is infra_error (or
    extend the deadline by that wait, up to a bound, then infra_error)."""
    name = mark()
    body = """
        signal.sigwait({signal.SIGUSR1})
        total = 0
        for i in range(3 * 10**7):
            total += i
    """
    with cgroup(CGROUP_V1 / "cpu", {"cpu.cfs_quota_us": "1000"}) as slow:
        limits = SandboxLimits(timeout_s=4, cpu_s=60)
        status = await strike(name, program(name, body), limits, move_and_go(slow))
    assert status == INFRA


@pytest.mark.skipif(bool(writable("cpu")), reason=str(writable("cpu")))
@pytest.mark.parametrize("backend", ["gvisor"], indirect=True)
@pytest.mark.usefixtures("short_starvation_bound")
async def test_a_gvisor_program_starved_of_cpu_by_the_host_is_an_infra_error(backend: str) -> None:
    """The same on gVisor, whose program has no process of its own on this host: its sandbox's
    (gVisor's kernel, its gofer and the stubs that run the program's code) throttled to 1% of a
    CPU while the program computes. Backend: the wait that counts is its sandbox threads' (the
    namespace's pid 1 is runsc's gofer, idle throughout), so infra_error, not a timeout."""
    body = "while True:\n    pass"  # unthrottled, a timeout at its deadline
    limits = SandboxLimits(timeout_s=4, cpu_s=60)
    with cgroup(CGROUP_V1 / "cpu", {"cpu.cfs_quota_us": "1000"}) as slow:
        gvisor = cold_backend(backend)  # closed before the test's group is removed
        try:
            run = asyncio.create_task(gvisor.run(program("g", body), CHECK, limits, "add"))
            groups: list[Path] = []
            while not groups:
                assert not run.done(), f"the run ended before it started: {await outcome(run)}"
                await asyncio.sleep(0.1)
                groups = [  # the run's, not the start-up probe's (`<pid>-probe-*`, gone)
                    group
                    for group in (CGROUP_ROOT / "memory" / "tempered").glob(f"{os.getpid()}-*")
                    if "-probe-" not in group.name
                ]
            await asyncio.sleep(2.0)  # its container up, its program in add()
            assert not run.done(), f"the run ended before the fault: {await outcome(run)}"
            for pid in Cgroups.named(groups[0].name).pids():
                with contextlib.suppress(OSError):  # gone meanwhile
                    (slow / "cgroup.procs").write_text(str(pid))
            with pytest.raises(SandboxInfraError, match="starved"):
                await asyncio.wait_for(run, 120)
        finally:
            await gvisor.close()


# -- the program's own failures keep their statuses ------------------------------------------


@pytest.mark.parametrize("blocks", [64, 24], ids=["4x", "1.5x"])
async def test_a_program_over_its_own_memory_limit_is_memory_exceeded(
    backend: str, blocks: int
) -> None:
    """8 MiB blocks, `blocks` of them, under a 128 MiB limit; gVisor's sandbox group holds its
    own kernel too (`SENTRY_MEMORY_MB` more), so there the program's address-space cap holds it
    to its limit."""
    body = f"hog = [b'x' * (8 << 20) for _ in range({blocks})]"
    limits = SandboxLimits(timeout_s=20, memory_mb=128)
    status = await run_alone(body, limits, backend)
    assert status == ExecStatus.MEMORY_EXCEEDED


@pytest.mark.parametrize(
    "body",
    [
        "while True:\n    pass",
        "signal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True:\n    pass",
    ],
    ids=["spinning", "ignoring-sigxcpu"],
)
async def test_a_program_spinning_past_its_cpu_limit_is_a_timeout(backend: str, body: str) -> None:
    """SIGXCPU at its CPU limit ends it; one that ignores SIGXCPU is SIGKILLed a second later,
    a timeout too, as it used its CPU time (the launcher reports the candidate's CPU seconds:
    on gVisor its sandbox's)."""
    limits = SandboxLimits(timeout_s=30, cpu_s=1)
    status = await run_alone(body, limits, backend)
    assert status == ExecStatus.TIMEOUT


@pytest.mark.alone  # whose CPU kept it waiting is read from the machine: none of other tests'
async def test_a_program_that_starves_itself_is_a_timeout(backend: str) -> None:
    """Spinning threads of its own keep its answering thread waiting for a CPU: that wait is the
    program's doing (its processes used the CPUs), so the deadline is its timeout."""
    body = """
        import threading
        def spin():
            while True:
                pass
        for _ in range(8):
            threading.Thread(target=spin, daemon=True).start()
        while True:
            pass
    """
    limits = SandboxLimits(timeout_s=1.5, cpu_s=60)
    status = await run_alone(body, limits, backend)
    assert status == ExecStatus.TIMEOUT


@pytest.mark.parametrize(
    "body",
    [
        "os.kill(os.getpid(), signal.SIGKILL)\nos.kill(1, signal.SIGKILL)\nreturn a - b",
        "os._exit(3)",
    ],
    ids=["sigkill-itself", "exit-mid-call"],
)
async def test_a_program_that_ends_itself_is_its_own_failure(backend: str, body: str) -> None:
    """Only the host can SIGKILL the candidate (its pid namespace's init ignores it from
    inside; gVisor's kernel lets it, and then it is its own doing), and an exit of its own is
    the program's doing: failed or error, never retried."""
    limits = SandboxLimits(timeout_s=20)
    status = await run_alone(body, limits, backend)
    assert status in (ExecStatus.FAILED, ExecStatus.ERROR)
