"""The gVisor backend against the real runsc: the local backend's contract, with the candidate in
a gVisor container; how a container's end is read (its own exit, its own SIGKILL, a dead
sandbox). Skipped, with the reason, where runsc is missing or cannot start a container here.
Hostile programs: test_adversarial.py (it runs every case on gVisor too)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox import SandboxInfraError
from infra.sandbox import gvisor as gvisor_module
from infra.sandbox.cgroups import CGROUP_ROOT, sweep_dead_workers
from infra.sandbox.gvisor import GVisorBackend
from infra.sandbox.retrying import run_retrying
from infra.settings import GVisorSettings
from tests.infra.sandbox.verifier_box import Box, gvisor_missing

CHECK = "def check(candidate):\n    assert candidate(1, 2) == 3\n"
pytestmark = pytest.mark.xdist_group(__name__)  # one worker starts the `gvisor` box


@pytest.fixture(scope="module")
def gvisor() -> Iterator[Box]:
    if reason := gvisor_missing():
        pytest.skip(reason)
    box = Box("gvisor")
    yield box
    box.close()


@pytest.mark.parametrize(
    ("program", "status"),
    [
        ("def add(a, b):\n    return a + b\n", ExecStatus.PASSED),
        ("def add(a, b):\n    return a - b\n", ExecStatus.FAILED),
        ("def add(a, b):\n    return a +\n", ExecStatus.ERROR),
        ("x = bytearray(8 * 2**30)\n", ExecStatus.MEMORY_EXCEEDED),
        ("while True:\n    pass\n", ExecStatus.TIMEOUT),
        ("import os\nos._exit(3)\n", ExecStatus.FAILED),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", ExecStatus.FAILED),
    ],
)
def test_statuses(gvisor: Box, program: str, status: ExecStatus) -> None:
    # the spinning program waits out its deadline (its own CPU time, which a loaded host
    # stretches): 1 s proves the status as well as 3 s; the others end by themselves
    timeout_s = 1 if status is ExecStatus.TIMEOUT else 3
    result = gvisor.run(program, CHECK, "add", limits=SandboxLimits(timeout_s=timeout_s))
    assert result.status == status, result
    assert result.backend == "gvisor" and result.tests_total == 1


def test_the_programs_output_reaches_stdout_capped(gvisor: Box) -> None:
    limits = SandboxLimits(timeout_s=5, output_bytes=300)
    program = "import sys\nprint('o' * 200, flush=True)\nprint('e' * 1000, file=sys.stderr)\n"
    result = gvisor.run(program, limits=limits)
    assert result.status == ExecStatus.PASSED and result.truncated, result
    # stderr joins stdout (stdio only), within the cap (what of each it keeps: process.Capture)
    assert "o" * 100 in result.stdout and "e" * 50 in result.stdout, result.stdout
    assert len(result.stdout.encode()) <= limits.output_bytes


def test_the_candidate_is_alone_in_its_container(gvisor: Box) -> None:
    program = "import os\nprint(os.getpid(), [p for p in os.listdir('/proc') if p.isdigit()])\n"
    assert gvisor.run(program).stdout == "1 ['1']\n"


def test_a_dead_sandbox_is_a_platform_fault(gvisor: Box) -> None:
    async def kill_the_sentry_mid_run() -> None:
        run = asyncio.ensure_future(
            gvisor.run_async(
                "import time\ndef add(a, b):\n    time.sleep(30)\n",
                CHECK,
                "add",
                limits=SandboxLimits(timeout_s=20),
            )
        )
        await asyncio.sleep(1.0)
        assert isinstance(gvisor.backend, GVisorBackend)
        state = str(gvisor.backend.launcher.state)
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if state in cmdline and " boot " in cmdline:
                proc.kill()  # every sandbox of the backend: the one in flight among them
        await run

    with pytest.raises(SandboxInfraError, match="sandbox died"):
        gvisor.loop.run_until_complete(kill_the_sentry_mid_run())
    # a pair warmed while the sentries died may be dead too, and tell so only when used: the
    # next run is retried as an activity's would be, and the backend serves it
    outcome = gvisor.loop.run_until_complete(
        run_retrying(
            gvisor.backend, "def add(a, b):\n    return a + b\n", CHECK, SandboxLimits(), "add"
        )
    )
    assert outcome.result is not None and outcome.result.status == ExecStatus.PASSED


def test_missing_runsc_is_an_infra_error() -> None:
    backend = GVisorBackend(warm=0)
    backend.launcher.runsc = None
    with pytest.raises(SandboxInfraError, match="runsc"):
        asyncio.run(backend.run("print(1)"))


def test_a_program_over_its_memory_limit_is_memory_exceeded_on_every_backend(
    any_box: Box,
) -> None:
    """1.5 x `memory_mb`, touched: the limit is the program's on gVisor too (its sandbox's
    cgroup holds gVisor's own kernel on top, so only the program's address-space cap holds it
    to `memory_mb`: `launcher.candidate_space_mb`'s held cap)."""
    program = (
        "def add(a, b):\n    blocks = []\n    for _ in range(192):\n"
        "        blocks.append(bytearray(1 << 20))\n        blocks[-1][::4096] = b'x' * 256\n"
        "    return a + b\n"
    )
    limits = SandboxLimits(timeout_s=20, memory_mb=128)
    result = any_box.run(program, CHECK, "add", limits=limits)
    assert result.status == ExecStatus.MEMORY_EXCEEDED, result


def test_shared_memory_is_writable_on_every_backend(any_box: Box) -> None:
    """multiprocessing's locks live in /dev/shm: a tmpfs of the run's size, as /tmp is."""
    program = (
        "import multiprocessing, os\nmultiprocessing.Lock()\n"
        "print(oct(os.stat('/dev/shm').st_mode & 0o7777))\n"
    )
    result = any_box.run(program, limits=SandboxLimits(timeout_s=10))
    assert result.status == ExecStatus.PASSED and result.stdout == "0o1777\n", result


WORKER = """
import asyncio, sys
from contracts.task import SandboxLimits
from infra.sandbox.gvisor import GVisorBackend

async def main() -> None:
    backend = GVisorBackend(warm=0)
    program = "import time\\ndef add(a, b):\\n    time.sleep(60)\\n"
    limits = SandboxLimits(timeout_s=60)
    run = asyncio.ensure_future(backend.run(program, {check!r}, limits, "add"))
    while not backend.launcher._runs:
        await asyncio.sleep(0.05)
    (container,) = backend.launcher._runs.values()
    print(backend.launcher.state, container.bundle, flush=True)
    await run

asyncio.run(main())
"""


def runsc_processes(marker: str) -> dict[psutil.Process, str]:
    """Live processes whose command line holds `marker`, with that command line."""
    found = {}
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in cmdline:
            found[proc] = cmdline
    return found


def test_a_crashed_workers_container_dies_with_it_and_the_sweep_removes_what_it_left(
    gvisor: Box,
) -> None:
    """A worker SIGKILLed mid-run (as a crash or the OOM killer ends one): its `runsc run` dies
    with it (and runsc's sandbox with that), and `sweep_dead_workers` (a later worker's start)
    removes its container's bundle, runsc's state dir and the run's cgroups."""
    worker = subprocess.Popen(
        ["nice", "-n", "10", sys.executable, "-c", WORKER.format(check=CHECK)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[3],
    )
    assert worker.stdout is not None
    try:
        crash_and_sweep(worker)
    finally:  # what a failed assertion left: the dead worker's container, groups and dirs
        worker.kill()
        worker.wait()
        sweep_dead_workers(worker.pid)


def crash_and_sweep(worker: subprocess.Popen[str]) -> None:
    """SIGKILL `worker` once its container runs; its runsc must die, the sweep its leftovers."""
    assert worker.stdout is not None
    try:
        state, bundle = worker.stdout.readline().split()
        deadline = time.monotonic() + 20
        while not any(" boot " in cmdline for cmdline in runsc_processes(state).values()):
            assert time.monotonic() < deadline, "the worker's container never came up"
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        worker.kill()
        worker.wait()
    deadline = time.monotonic() + 10
    while left := runsc_processes(state):
        if time.monotonic() > deadline:
            for proc in left:  # the test's own cleanup: the assertion below reports them
                with contextlib.suppress(psutil.Error):
                    proc.kill()
            pytest.fail(f"the dead worker's runsc outlived it: {list(left.values())}")
        time.sleep(0.2)
    sweep_dead_workers()
    assert not Path(bundle).exists() and not Path(state).exists()
    assert not list(CGROUP_ROOT.glob(f"*/tempered/{worker.pid}-*"))


def test_a_runsc_that_cannot_start_a_container_is_refused_once_in_its_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """This Debian runsc (2022) has no systrap platform: the backend's probe container says so
    (runsc's own words, the platform named), and every run is refused with that, without
    starting runsc again (a run used to fail after its container's start, retried for ever)."""
    if reason := gvisor_missing():
        pytest.skip(reason)
    backend = GVisorBackend(GVisorSettings(platform="systrap"), warm=0)
    why = backend.probe()
    if not why:
        pytest.skip("this runsc runs systrap")
    assert "--platform=systrap" in why and "unknown platform" in why, why
    tries = []
    monkeypatch.setattr(gvisor_module, "probe_once", lambda *a: tries.append(a) or "said no")
    for _ in range(2):
        with pytest.raises(SandboxInfraError) as refused:
            asyncio.run(backend.run("print(1)"))
        assert why in str(refused.value)
    assert tries == []  # the verdict of the backend's probe holds for good


def test_a_runsc_that_never_comes_up_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A container that does not come up (runsc with platform=kvm where KVM does not work
    waits for ever, silent): every try of the probe waits its timeout, then the platform is
    refused."""
    hang = tmp_path / "runsc"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(0o755)
    monkeypatch.setattr(gvisor_module, "PROBE_TIMEOUT_S", 0.5)
    backend = GVisorBackend(GVisorSettings(platform="kvm"), warm=0)
    backend.launcher.runsc = str(hang)
    why = backend.probe()
    assert "--platform=kvm" in why and "no container came up in 0.5 s" in why, why


THREADS = (
    "import threading\ndef add(a, b):\n    stop = threading.Event()\n"
    "    threads = [threading.Thread(target=stop.wait) for _ in range(100)]\n"
    "    for thread in threads:\n        thread.start()\n"
    "    stop.set()\n    for thread in threads:\n        thread.join()\n    return a + b\n"
)


def test_a_hundred_threads_start_under_512_mb_on_every_backend(any_box: Box) -> None:
    """Under the held address-space cap (memory + 64 MiB: gVisor, Kubernetes) each thread's
    stack reservation counts: at glibc's 8 MiB a program got ~61 threads there and ~150 locally,
    so a ThreadPoolExecutor(100) passed locally and failed in the held sandboxes."""
    limits = SandboxLimits(timeout_s=20, memory_mb=512, max_processes=128)
    result = any_box.run(THREADS, CHECK, "add", limits=limits)
    assert result.status == ExecStatus.PASSED, result


def test_a_probe_killed_mid_run_leaves_no_cgroups_after_the_sweep() -> None:
    """The probe's container runs in this worker's `<pid>-probe-*` groups (runsc made `probe` at
    each controller's root before, which no sweep walks): a probe killed at its timeout leaves
    nothing once `sweep_dead_workers` ran."""
    if reason := gvisor_missing():
        pytest.skip(reason)
    backend = GVisorBackend(warm=0)
    launcher = backend.launcher
    assert launcher.runsc is not None
    said = gvisor_module.probe_once(
        launcher.runsc, launcher.setpriv, launcher.platform, launcher.python, 0.15
    )
    try:
        assert said is None  # killed before it ran
        assert not [p for p in CGROUP_ROOT.glob("*/probe") if p.is_dir()]
    finally:
        sweep_dead_workers(os.getpid())
    assert not list(CGROUP_ROOT.glob(f"*/tempered/{os.getpid()}-probe*"))


def test_probes_at_once_all_run() -> None:
    """runsc names a sandbox's control socket (abstract, host-wide) after its container's id: two
    workers probing at once with one id ("probe") failed, "address already in use", and the
    loser refused every run (86 tests of one CI run). Each probe's id is its own."""
    if reason := gvisor_missing():
        pytest.skip(reason)
    launcher = GVisorBackend(warm=0).launcher
    assert launcher.runsc is not None and launcher.setpriv is not None

    def probe(_: int) -> str | None:
        return gvisor_module.probe_once(
            launcher.runsc, launcher.setpriv, launcher.platform, launcher.python, 30.0
        )

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(probe, range(4))) == ["", "", "", ""]
