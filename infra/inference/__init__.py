"""Inference: sample completions from a published policy version, batched across workflows.

    from infra.inference import Batcher, PolicyResolver, get_backend
    backend = get_backend(settings)                  # settings.inference.backend: local | vllm
    batcher = Batcher(backend, settings.inference.max_batch, settings.inference.max_wait_ms)
    policy = await PolicyResolver(store, cache_dir).resolve(run_id)        # newest version
    result = await batcher.submit(prompt_ids, sampling_params, policy)

Backends are imported lazily so a worker only loads what it uses (torch for `local`).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from infra.inference.base import (
    GenerationOutput,
    InferenceBackend,
    InferenceError,
    PolicyHandle,
    PolicyResolver,
)
from infra.inference.batcher import Batcher, BatchResult

if TYPE_CHECKING:
    from infra.settings import Settings

__all__ = [
    "BACKENDS",
    "BatchResult",
    "Batcher",
    "GenerationOutput",
    "InferenceBackend",
    "InferenceError",
    "PolicyHandle",
    "PolicyResolver",
    "get_backend",
]

BACKENDS: dict[str, tuple[str, str]] = {
    "local": ("infra.inference.local", "LocalBackend"),
    "vllm": ("infra.inference.vllm", "VLLMBackend"),
}


def get_backend(settings: Settings, name: str | None = None) -> InferenceBackend:
    """The backend named `name` (default `settings.inference.backend`), built from `settings`."""
    chosen = name or settings.inference.backend
    if chosen not in BACKENDS:
        raise ValueError(f"unknown inference backend {chosen!r}; choose one of {sorted(BACKENDS)}")
    module_name, class_name = BACKENDS[chosen]
    backend: InferenceBackend = getattr(import_module(module_name), class_name)(settings)
    return backend
