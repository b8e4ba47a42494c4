"""gVisor's own host tasks against the real runsc (ptrace): a program within its `max_processes`
never runs its sandbox out of host tasks (`gvisor.sentry_tasks`), a fork bomb is held inside by
RLIMIT_NPROC (the program's failure, the host's limit never reached), and a sandbox that runs
out anyway is a platform fault, never the program's "reached its limit of N processes".
Skipped, with the reason, where runsc is missing or cannot start a container here."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox import SandboxInfraError
from infra.sandbox.cgroups import CGROUP_ROOT
from infra.sandbox.gvisor import GVisorBackend
from tests.infra.sandbox.attacks import TESTS
from tests.infra.sandbox.verifier_box import Box, gvisor_missing


@pytest.fixture(scope="module")
def gvisor() -> Iterator[Box]:
    if reason := gvisor_missing():
        pytest.skip(reason)
    box = Box("gvisor", warm=0)
    yield box
    box.close()


def busy_children(count: int, seconds: float = 2.0) -> str:
    """An honest `add` whose module first runs `count` children, each reading a file in a loop
    for `seconds` (system calls: gVisor's busiest case under ptrace), and waits for them."""
    return (
        f"import os, time\nkids = []\nfor _ in range({count}):\n    pid = os.fork()\n"
        f"    if pid == 0:\n        end = time.time() + {seconds}\n"
        "        while time.time() < end:\n            open('/usr/bin/python3', 'rb').read(4096)\n"
        "        os._exit(0)\n    kids.append(pid)\nfor kid in kids:\n    os.waitpid(kid, 0)\n"
        "def add(a, b):\n    return a + b\n"
    )


@contextmanager
def host_task_peaks() -> Iterator[dict[str, tuple[int, int]]]:
    """{group: (pids.peak, pids.max)} of this worker's run groups, read while the block runs
    (the verifier removes a run's group once it is judged)."""
    seen: dict[str, tuple[int, int]] = {}
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            for group in (CGROUP_ROOT / "pids" / "tempered").glob(f"{os.getpid()}-*"):
                try:
                    limit = (group / "pids.max").read_text().strip()
                    peak = int((group / "pids.peak").read_text())
                except (OSError, ValueError):
                    continue  # gone meanwhile
                if limit != "max":
                    seen[group.name] = (max(peak, seen.get(group.name, (0, 0))[0]), int(limit))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield seen
    finally:
        done.set()
        watcher.join()


def test_a_program_with_its_full_limit_of_busy_processes_passes(gvisor: Box) -> None:
    """32 children reading a file (the program's whole limit with its main process, 33): under
    ptrace each address space has a stub process with a thread per Sentry thread that ran it,
    ~1000-3000 host tasks here; with 256 on top of the program's limit the Sentry panicked and
    the program was told it "reached its limit of 32 processes" (from 12 busy children on)."""
    limits = SandboxLimits(timeout_s=30, cpu_s=60, max_processes=33)
    with host_task_peaks() as peaks:
        result = gvisor.run(busy_children(32), TESTS, "add", limits=limits)
    assert result.status == ExecStatus.PASSED, result
    assert "panic" not in result.stdout, result.stdout[:500]
    assert peaks and all(peak < limit for peak, limit in peaks.values()), peaks


def test_a_fork_bomb_is_held_inside_by_its_own_limit(gvisor: Box) -> None:
    """RLIMIT_NPROC holds the program to `max_processes` inside gVisor (its forks fail with
    EAGAIN), so the bomb spins to its deadline, its own failure; the host's limit on the
    sandbox's tasks, gVisor's own worst case on top, is never reached, and nothing is left."""
    program = (
        "import os\nopen('/tmp/bomb', 'w').close()\nheld = False\nwhile True:\n    try:\n"
        "        os.fork()\n    except OSError:\n        if not held:\n"
        "            held = True\n            print('held', flush=True)\n"
    )
    with host_task_peaks() as peaks:
        result = gvisor.run(program, limits=SandboxLimits(timeout_s=3, max_processes=16))
    assert result.status == ExecStatus.TIMEOUT, result
    assert "held" in result.stdout and "panic" not in result.stdout, result.stdout[:500]
    assert peaks and all(peak < limit for peak, limit in peaks.values()), peaks
    assert gvisor.leftovers("bomb") == []


def test_a_sandbox_out_of_host_tasks_is_a_platform_fault(gvisor: Box) -> None:
    """Where the host's limit is reached anyway (here: a launcher allowing gVisor 64 tasks, a
    few busy children), it was gVisor's, not the program's (held to its own limit inside):
    a platform fault in those words, never "reached its limit of N processes" (failed)."""
    assert isinstance(gvisor.backend, GVisorBackend)
    launcher = gvisor.backend.launcher
    sized = launcher.processes_overhead
    launcher.processes_overhead = 64
    try:
        with pytest.raises(SandboxInfraError, match="ran out of host tasks"):
            gvisor.run(busy_children(8), TESTS, "add", limits=SandboxLimits(timeout_s=30))
    finally:
        launcher.processes_overhead = sized
    gvisor.settle()
    result = gvisor.run("def add(a, b):\n    return a + b\n", TESTS, "add")
    assert result.status == ExecStatus.PASSED, result  # the backend serves the next run
