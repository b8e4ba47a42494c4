"""The gVisor backend against the real runsc: the local backend's contract, with the candidate in
a gVisor container; how a container's end is read (its own exit, its own SIGKILL, a dead
sandbox). Skipped, with the reason, where runsc is missing or cannot start a container here.
Hostile programs: test_adversarial.py (it runs every case on gVisor too)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import psutil
import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox import SandboxInfraError
from infra.sandbox.gvisor import GVisorBackend
from infra.sandbox.retrying import run_retrying
from tests.infra.sandbox.verifier_box import Box, gvisor_missing

CHECK = "def check(candidate):\n    assert candidate(1, 2) == 3\n"


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
    result = gvisor.run(program, CHECK, "add", limits=SandboxLimits(timeout_s=3))
    assert result.status == status, result
    assert result.backend == "gvisor" and result.tests_total == 1


def test_the_programs_output_reaches_stdout_capped(gvisor: Box) -> None:
    limits = SandboxLimits(timeout_s=5, output_bytes=300)
    program = "import sys\nprint('o' * 200, flush=True)\nprint('e' * 1000, file=sys.stderr)\n"
    result = gvisor.run(program, limits=limits)
    assert result.status == ExecStatus.PASSED and result.truncated, result
    assert result.stdout == "o" * 200 + "\n" + "e" * 99  # stderr joins stdout (stdio only)


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
