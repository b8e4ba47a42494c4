"""Sandbox backends: run untrusted model-written Python against its tests, under strict limits.

    from infra.sandbox import get_backend
    backend = get_backend(settings)            # settings.sandbox.backend, or name="gvisor"
    result = await backend.run(program, tests, limits, "add", task.helpers, task.hidden_tests)

Every backend runs the same two-process verifier (`verifier.py`): the tests, the task's helpers
and the verdict live in a checker process; the program runs in a separate, confined candidate
process and is only ever called with, and answers in, plain data (`codec.py`). Nothing of the
program shares an interpreter, memory or a file descriptor with the code that decides the
verdict, which is why a wrong program cannot make it say `passed` (tests/infra/sandbox/
test_adversarial.py tries, class by class). Each backend is built from its own settings
sub-model (`settings.sandbox.local`, `.gvisor`, `.kubernetes`); nothing else of `Settings`
reaches it.
"""

from __future__ import annotations

from infra.sandbox.base import SandboxBackend, SandboxInfraError
from infra.sandbox.gvisor import GVisorBackend
from infra.sandbox.kubernetes import KubernetesBackend
from infra.sandbox.local import LocalBackend
from infra.settings import SandboxBackendName, Settings, unknown_backend

__all__ = ["SandboxBackend", "SandboxInfraError", "get_backend"]


def get_backend(settings: Settings, name: str | None = None) -> SandboxBackend:
    """The backend named `name` (default `settings.sandbox.backend`), built from its settings."""
    sandbox = settings.sandbox
    match name or sandbox.backend:
        case "local":
            return LocalBackend(sandbox.local, warm=min(sandbox.local.warm, sandbox.concurrency))
        case "gvisor":
            return GVisorBackend(sandbox.gvisor)
        case "kubernetes":
            return KubernetesBackend(sandbox.kubernetes)
        case unknown:
            raise unknown_backend("sandbox", unknown, SandboxBackendName)
