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


@cache
def gvisor_missing() -> str:
    """Why the gvisor backend cannot run here ("" when it can): a probe run, once."""
    if shutil.which("runsc") is None or shutil.which("bwrap") is None or os.geteuid() != 0:
        return "needs runsc, bwrap and root"
    box = Box("gvisor", warm=0)
    try:
        result = box.run("print('up')\n")
    except Exception as exc:  # noqa: BLE001 - any failure to run is the reason to skip
        return f"runsc cannot run here: {exc}"
    finally:
        box.close()
    return "" if result.stdout == "up\n" else f"the runsc probe printed {result.stdout!r}"


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
