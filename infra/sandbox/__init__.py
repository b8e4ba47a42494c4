"""Sandbox backends: run untrusted model-written Python under strict limits.

    from infra.sandbox import get_backend
    backend = get_backend(settings)            # settings.sandbox.backend, or name="gvisor"
    result = await backend.run(program, tests, limits, entry_point="add")

Backends are imported lazily so a worker only loads what it uses.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from infra.sandbox.base import SandboxBackend, SandboxInfraError

if TYPE_CHECKING:
    from infra.settings import Settings

__all__ = ["BACKENDS", "SandboxBackend", "SandboxInfraError", "get_backend"]

BACKENDS: dict[str, tuple[str, str]] = {
    "local": ("infra.sandbox.local", "LocalBackend"),
    "gvisor": ("infra.sandbox.gvisor", "GVisorBackend"),
    "kubernetes": ("infra.sandbox.kubernetes", "KubernetesBackend"),
}


def get_backend(settings: Settings, name: str | None = None) -> SandboxBackend:
    """The backend named `name` (default `settings.sandbox.backend`), built from `settings`."""
    chosen = name or settings.sandbox.backend
    if chosen not in BACKENDS:
        raise ValueError(f"unknown sandbox backend {chosen!r}; choose one of {sorted(BACKENDS)}")
    module_name, class_name = BACKENDS[chosen]
    backend_cls = getattr(import_module(module_name), class_name)
    backend: SandboxBackend = backend_cls(settings)
    return backend
