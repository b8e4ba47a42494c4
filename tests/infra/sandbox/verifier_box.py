"""A sandbox backend driven synchronously by tests (real bwrap, zygotes, runsc).

from tests.infra.sandbox.verifier_box import Box, needs_root
pytestmark = needs_root
def test_x(box: Box) -> None:             # module-scoped fixtures `box`, `any_box`: conftest.py
    result = box.run("def f(x):\n    return x\n", "assert f(1) == 1\n")
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import textwrap
from functools import cache
from pathlib import Path

import psutil
import pytest

from contracts.sandbox import ExecutionResult
from contracts.task import SandboxLimits
from infra.sandbox.forkserver import worker_uids
from infra.sandbox.gvisor import GVisorBackend
from infra.sandbox.local import LocalBackend
from infra.settings import GVisorSettings

FAST = SandboxLimits(timeout_s=5)
needs_root = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bwrap and root"
)


class Box:
    """One backend (`local` or `gvisor`) on its own event loop, driven synchronously."""

    def __init__(self, backend: str = "local", warm: int = 2) -> None:
        self.loop = asyncio.new_event_loop()
        self.backend = LocalBackend(warm=warm) if backend == "local" else GVisorBackend(warm=warm)
        self.verifier = self.backend.verifier

    def run(
        self,
        program: str,
        tests: str = "",
        entry_point: str | None = None,
        helpers: str = "",
        limits: SandboxLimits = FAST,
        hidden_tests: str = "",
    ) -> ExecutionResult:
        return self.loop.run_until_complete(
            self.run_async(program, tests, entry_point, helpers, limits, hidden_tests)
        )

    async def run_async(
        self,
        program: str,
        tests: str = "",
        entry_point: str | None = None,
        helpers: str = "",
        limits: SandboxLimits = FAST,
        hidden_tests: str = "",
    ) -> ExecutionResult:
        program, tests, helpers, hidden_tests = (
            textwrap.dedent(text) for text in (program, tests, helpers, hidden_tests)
        )
        return await self.backend.run(program, tests, limits, entry_point, helpers, hidden_tests)

    def settle(self) -> None:
        """Let released runs finish dying (their teardown runs in the background)."""
        self.loop.run_until_complete(asyncio.sleep(0.3))

    def leftovers(self, marker: str) -> list[psutil.Process]:
        """Processes of finished runs still alive, after a moment to die: local candidates
        whose /tmp holds the file `marker`; gVisor sandboxes of no container a pair still owns."""
        for _ in range(20):
            self.settle()
            if isinstance(self.backend, LocalBackend):
                left = [
                    proc
                    for proc in candidate_processes()
                    if Path(f"/proc/{proc.pid}/root/tmp/{marker}").exists()
                ]
            else:
                owned = [str(run.bundle) for run in self.backend.launcher._runs.values()]
                state = str(self.backend.launcher.state)
                left = []
                for proc in candidate_processes():
                    with contextlib.suppress(psutil.Error):
                        cmdline = " ".join(proc.cmdline())
                        if state in cmdline and not any(bundle in cmdline for bundle in owned):
                            left.append(proc)
            if not left:
                return []
        return left

    def close(self) -> None:
        self.loop.run_until_complete(self.backend.close())
        self.loop.close()


def gvisor_missing() -> str:
    """Why the gvisor backend cannot run here ("" when it can), to skip on: runsc, setpriv,
    bwrap or root missing, or a kernel without what the default platform needs. Where all are
    here, a probe run that fails is the backend's fault: the test fails, in runsc's words."""
    if failed := _gvisor_probe():
        pytest.fail(f"the gvisor backend runs no program here: {failed}", pytrace=False)
    return _gvisor_absent()


def _gvisor_absent() -> str:
    if missing := [tool for tool in ("runsc", "setpriv", "bwrap") if shutil.which(tool) is None]:
        return f"needs {', '.join(missing)}"
    if os.geteuid() != 0:
        return "needs root"
    platform = GVisorSettings().platform
    if platform == "kvm" and not os.path.exists("/dev/kvm"):
        return "the kvm platform needs /dev/kvm"
    # ptrace_scope 3: no process may ptrace another, so the ptrace platform runs nothing
    scope = Path("/proc/sys/kernel/yama/ptrace_scope")
    if platform == "ptrace" and scope.exists() and scope.read_text().strip() == "3":
        return "the ptrace platform needs ptrace (kernel.yama.ptrace_scope is 3)"
    return ""


@cache
def _gvisor_probe() -> str:
    """Why a probe run on the gvisor backend failed where nothing is missing ("" when it
    printed what it should, or when something is missing): once per test process."""
    if _gvisor_absent():
        return ""
    box = Box("gvisor", warm=0)
    try:
        result = box.run("print('up')\n")
    except Exception as exc:  # noqa: BLE001 - reported as the test's failure
        return f"{type(exc).__name__}: {exc}"
    finally:
        box.close()
    return "" if result.stdout == "up\n" else f"the probe run gave {result!r}"


def candidate_processes() -> list[psutil.Process]:
    """Live processes under this worker's candidate uids (the checker uid, offset 0, excluded:
    the checker zygote lives as long as the verifier), and gVisor sandboxes of this process."""
    uids, state, left = worker_uids()[1:], f"tempered-runsc-{os.getpid()}-", []
    for proc in psutil.process_iter(["uids", "status", "cmdline"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        mine = proc.info["uids"] and proc.info["uids"].real in uids
        if mine or state in " ".join(proc.info["cmdline"] or []):
            left.append(proc)
    return left
