"""The gVisor backend against the real runsc: the same contract as local (slow: ~1 s a run).

Skipped, with the reason, where runsc is missing or cannot start a container on this kernel.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox import SandboxInfraError
from infra.sandbox.gvisor import GVisorBackend

CHECK = "def check(candidate):\n    assert candidate(1, 2) == 3\n"


def _why_not() -> str | None:
    if shutil.which("runsc") is None:
        return "runsc is not installed"
    if os.geteuid() != 0:
        return "runsc run needs root"
    probe = GVisorBackend()
    try:
        result = asyncio.run(probe.run("print('up')"))
    except SandboxInfraError as exc:
        return f"runsc cannot run here: {exc}"
    finally:
        asyncio.run(probe.close())
    return None if result.stdout == "up\n" else f"runsc probe printed {result.stdout!r}"


pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def backend() -> Iterator[GVisorBackend]:
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    chosen = GVisorBackend()
    yield chosen
    asyncio.run(chosen.close())


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("program", "status"),
    [
        ("def add(a, b):\n    return a + b\n", ExecStatus.PASSED),
        ("def add(a, b):\n    return a - b\n", ExecStatus.FAILED),
        ("def add(a, b):\n    return a +\n", ExecStatus.ERROR),
        ("x = bytearray(8 * 2**30)\n", ExecStatus.MEMORY_EXCEEDED),
        ("while True:\n    pass\n", ExecStatus.TIMEOUT),
    ],
)
async def test_statuses(backend: GVisorBackend, program: str, status: ExecStatus) -> None:
    result = await backend.run(program, CHECK, SandboxLimits(timeout_s=3), "add")
    assert result.status == status, result
    assert result.backend == "gvisor" and result.tests_total == 1


@pytest.mark.asyncio
async def test_output_and_truncation(backend: GVisorBackend) -> None:
    limits = SandboxLimits(timeout_s=5, output_bytes=300)
    result = await backend.run(
        "import sys\nprint('o' * 1000)\nprint('e' * 1000, file=sys.stderr)\n", "", limits
    )
    assert result.status == ExecStatus.PASSED and result.truncated
    assert result.stdout == "o" * 300 and result.stderr == "e" * 300


@pytest.mark.asyncio
async def test_missing_runsc_is_an_infra_error() -> None:
    backend = GVisorBackend()
    backend.runsc = None
    with pytest.raises(SandboxInfraError, match="runsc"):
        await backend.run("print(1)")
