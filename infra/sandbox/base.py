"""The sandbox backend Protocol every backend (local bwrap, gVisor, Kubernetes) implements.

A backend runs one untrusted Python program against its tests (and the task's hidden tests,
whose failures are never shown) under `SandboxLimits` and returns an `ExecutionResult`. The
tests, the task's helpers and the verdict live in a checker process the program cannot reach;
the program is only ever called with, and answers in, plain data (`verifier.py`). What the
*program* does is always a result (passed/failed/error/timeout/memory_exceeded); only a fault of
the platform itself raises `SandboxInfraError`, which callers retry and never turn into a reward.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from contracts.sandbox import ExecutionResult
from contracts.task import SandboxLimits

if TYPE_CHECKING:  # verifier.py imports this module
    from infra.sandbox.verifier import Verifier

DEFAULT_LIMITS = SandboxLimits()
"""The limits a `run` without explicit limits gets."""


class SandboxInfraError(Exception):
    """The platform failed (bwrap missing, no space, backend down): retry, never a reward."""


class JobTooLarge(ValueError):
    """The job (program and tests) is larger than the backend can carry (a pod spec, the
    verifier's codec frame): the same every time, so never worth a retry."""


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
        hidden_tests: str = "",
    ) -> ExecutionResult:
        """Run `program`, then every unit of `tests` and `check(entry_point)` (if given) against
        it. `helpers` is the task's own code (`TaskSpec.helpers`, trusted), run beside the tests
        so that what they call is the task's and never the program's. `hidden_tests`
        (`TaskSpec.hidden_tests`) run last, counted in the verdict, their failures never shown."""
        ...

    async def close(self) -> None:
        """Release whatever the backend holds (pools, clients)."""
        ...


class VerifierBackend:
    """A backend whose runs are its `Verifier`'s (local, gVisor): it only chooses the launcher."""

    name: str
    verifier: Verifier

    @property
    def enforcement(self) -> str:
        return self.verifier.enforcement

    async def run(
        self,
        program: str,
        tests: str = "",
        limits: SandboxLimits = DEFAULT_LIMITS,
        entry_point: str | None = None,
        helpers: str = "",
        hidden_tests: str = "",
    ) -> ExecutionResult:
        """Run `program`, then `tests`, `check(entry_point)` and `hidden_tests` against it, with
        the task's `helpers` (trusted code from the task) on the checker's side."""
        return await self.verifier.run(program, tests, limits, entry_point, helpers, hidden_tests)

    async def close(self) -> None:
        """Destroy the warm pairs and stop the launchers."""
        await self.verifier.close()
