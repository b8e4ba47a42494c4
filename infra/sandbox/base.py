"""The sandbox backend Protocol every backend (local bwrap, gVisor, Kubernetes) implements.

A backend runs one untrusted Python program against its tests under `SandboxLimits` and returns
an `ExecutionResult`. The tests, the task's helpers and the verdict live in a checker process
the program cannot reach; the program is only ever called with, and answers in, plain data
(`verifier.py`). What the *program* does is always a result (passed/failed/error/timeout/
memory_exceeded); only a fault of the platform itself raises `SandboxInfraError`, which callers
retry and never turn into a reward.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from contracts.sandbox import ExecutionResult
from contracts.task import SandboxLimits

DEFAULT_LIMITS = SandboxLimits()
"""The limits a `run` without explicit limits gets."""


class SandboxInfraError(Exception):
    """The platform failed (bwrap missing, no space, backend down): retry, never a reward."""


@runtime_checkable
class SandboxBackend(Protocol):
    """Runs untrusted code; one instance serves many concurrent `run` calls."""

    name: str

    async def run(
        self,
        program: str,
        tests: str = "",
        limits: SandboxLimits = DEFAULT_LIMITS,
        entry_point: str | None = None,
        helpers: str = "",
    ) -> ExecutionResult:
        """Run `program`, then every unit of `tests` and `check(entry_point)` (if given) against
        it. `helpers` is the task's own code (`TaskSpec.helpers`, trusted), run beside the tests
        so that what they call is the task's and never the program's."""
        ...

    async def close(self) -> None:
        """Release whatever the backend holds (pools, clients)."""
        ...
