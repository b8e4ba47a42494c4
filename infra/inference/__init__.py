"""Inference: sample completions from a published policy version, batched across workflows.

    from infra.inference import Batcher, PolicyResolver, get_backend
    backend = get_backend(settings)                  # settings.inference.backend: local | vllm
    batcher = Batcher(backend)                       # rows join the backend's running batch
    policy = await PolicyResolver(store, cache_dir).resolve(run_id)        # newest version
    result = await batcher.submit(prompt_ids, sampling_params, policy)

Each backend is built from its own settings sub-model (`settings.inference.local`, `.vllm`);
`get_backend` starts the `vllm` engine (on `settings.inference.base_model`) before it returns.
"""

from __future__ import annotations

from infra.inference.base import (
    GenerationOutput,
    InferenceBackend,
    InferenceError,
    PolicyHandle,
    PolicyResolver,
    model_positions,
)
from infra.inference.batcher import Batcher, BatchResult
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
    "model_positions",
]


def get_backend(
    settings: Settings, name: str | None = None, start: bool = True
) -> InferenceBackend:
    """The backend named `name` (default `settings.inference.backend`), built from its settings;
    a `vllm` engine is started and warmed up unless `start` is False (blocks for tens of
    seconds; an engine that cannot start raises `InferenceError` with one line saying why)."""
    inference = settings.inference
    match name or inference.backend:
        case "local":
            # Imported here: it imports torch (~2 s), which a vLLM worker never needs.
            from infra.inference.local import LocalBackend

            return LocalBackend(inference.local)
        case "vllm":
            from infra.inference.vllm import VLLMBackend

            backend = VLLMBackend(inference.vllm, wait_s=inference.policy_wait_s)
            if start:
                from infra.base_models import materialize_base_model

                backend.start(materialize_base_model(inference.base_model, settings))
            return backend
        case unknown:
            raise unknown_backend("inference", unknown, InferenceBackendName)
