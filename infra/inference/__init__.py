"""Inference: sample completions from a published policy version, batched across workflows.

    from infra.inference import Batcher, PolicyResolver, get_backend
    backend = get_backend(settings)                  # settings.inference.backend: local | vllm
    batcher = Batcher(backend, settings.inference.max_batch, settings.inference.max_wait_ms)
    policy = await PolicyResolver(store, cache_dir).resolve(run_id)        # newest version
    result = await batcher.submit(prompt_ids, sampling_params, policy)

Each backend is built from its own settings sub-model (`settings.inference.local`, `.vllm`).
"""

from __future__ import annotations

from infra.inference.base import (
    GenerationOutput,
    InferenceBackend,
    InferenceError,
    PolicyHandle,
    PolicyResolver,
)
from infra.inference.batcher import Batcher, BatchResult
from infra.inference.vllm import VLLMBackend
from infra.settings import InferenceBackendName, Settings, unknown_backend

__all__ = [
    "BatchResult",
    "Batcher",
    "GenerationOutput",
    "InferenceBackend",
    "InferenceError",
    "PolicyHandle",
    "PolicyResolver",
    "get_backend",
]


def get_backend(settings: Settings, name: str | None = None) -> InferenceBackend:
    """The backend named `name` (default `settings.inference.backend`), built from its settings."""
    inference = settings.inference
    match name or inference.backend:
        case "local":
            # Imported here: it imports torch (~2 s), which a vLLM worker never needs.
            from infra.inference.local import LocalBackend

            return LocalBackend(inference.local)
        case "vllm":
            return VLLMBackend(inference.vllm)
        case unknown:
            raise unknown_backend("inference", unknown, InferenceBackendName)
