"""A MemoryError the program raises itself is no proof that it exceeded its memory limit.

`def add(a, b): raise MemoryError('fake')` was reported `memory_exceeded` (the checker rebuilds
the builtin class and classified it so, and the host took the verdict as it was): the feedback
said the memory limit was hit, and the run counted toward the `abort_after` circuit breaker,
which one cheap raise could trip. Where the run's cgroup bounds its memory (the local backend
with cgroups), `memory_exceeded` needs the cgroup's accounting to say its limit was reached (a
real over-allocation is OOM-killed there); a MemoryError without it is the program's `error`.
Where an address-space cap is the bound (rlimit-only, gVisor, Kubernetes), the host cannot tell
the allocator's MemoryError from a raised one, and both stay `memory_exceeded` (`judge.judge`).
"""

from __future__ import annotations

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox.local import LocalBackend
from tests.infra.sandbox.attacks import TESTS
from tests.infra.sandbox.verifier_box import Box, needs_root

pytestmark = needs_root
LIMITS = SandboxLimits(timeout_s=10, memory_mb=128)
RAISED = {
    "raise-with-a-message": "def add(a, b):\n    raise MemoryError('fake')\n",
    "raise-bare": "def add(a, b):\n    raise MemoryError\n",
    "raise-at-import": "raise MemoryError()\n",
    "a-class-of-its-own": "class MemoryError(Exception):\n    pass\n"
    "def add(a, b):\n    raise MemoryError\n",
}
GROW = "blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 20))\n"


@pytest.mark.parametrize("program", RAISED.values(), ids=RAISED.keys())
def test_a_memory_error_the_program_raises_is_its_error(box: Box, program: str) -> None:
    assert box.verifier.enforcement == "cgroup"  # the host reads the run's memory accounting
    result = box.run(program, TESTS, "add", limits=LIMITS)
    assert result.status == ExecStatus.ERROR, result
    assert result.detail == "MemoryError" and "MemoryError" in result.stderr, result


def test_a_real_over_allocation_is_still_memory_exceeded(box: Box) -> None:
    result = box.run(GROW, TESTS, "add", limits=LIMITS)
    assert result.status == ExecStatus.MEMORY_EXCEEDED, result
    assert result.detail == "killed by the memory limit", result


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "program",
    [RAISED["raise-with-a-message"], "x = bytearray(300 * 2**20)\n"],
    ids=["raised", "allocated"],
)
async def test_without_cgroups_a_memory_error_cannot_be_told_apart(program: str) -> None:
    """Rlimit-only (no cgroups): RLIMIT_AS is the limit, and its MemoryError is the program's
    own exception as much as a raised one: both read `memory_exceeded`."""
    backend = LocalBackend(warm=0)
    backend.verifier.use_cgroups, backend.verifier.enforcement = False, "rlimit"
    try:
        result = await backend.run(program, TESTS, LIMITS, "add")
    finally:
        await backend.close()
    assert result.status == ExecStatus.MEMORY_EXCEEDED and result.enforcement == "rlimit", result
