"""The one settings model of Tempered: a section per concern, a sub-model per backend.

Values come, highest priority first, from constructor arguments, `TEMPERED_*` environment
variables (nested with `__`, e.g. `TEMPERED_S3__ENDPOINT`, `TEMPERED_SANDBOX__KUBERNETES__IMAGE`),
the TOML file named by `config` (`load_settings(path)`, else `$TEMPERED_CONFIG`, else
`tempered.toml` in the working directory when there is one), then the defaults below.

    from infra.settings import load_settings
    settings = load_settings()                   # or load_settings("my.toml", home=tmp)
    settings.sandbox.kubernetes.image            # a backend reads only its own sub-model

Each backend gets only its sub-model (`settings.sandbox.local`, `.gvisor`, `.kubernetes`,
`settings.inference.local`, `.vllm`); the factories `infra.sandbox.get_backend` and
`infra.inference.get_backend` hand it over. Loading never writes `os.environ`: a process that
starts workers passes `settings.config` and `settings.home` on explicitly.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    FilePath,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from contracts.common import describe_validation_error

LOCAL_CONFIG = "tempered.toml"
"""Read from the working directory when no config file is named."""
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
"""A Kubernetes namespace name (RFC 1123 label)."""
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
"""A Kubernetes object name such as a RuntimeClass's (RFC 1123 subdomain)."""
TORCH_DEVICE = r"^(cpu|cuda|mps|xpu)(:\d+)?$"
"""A torch device string this project runs on."""
SandboxBackendName = Literal["local", "gvisor", "kubernetes"]
InferenceBackendName = Literal["local", "vllm"]


def unknown_backend(kind: str, name: str, names: Any) -> ValueError:
    """The error for a backend `name` that is none of the Literal `names` (for the factories)."""
    return ValueError(
        f"unknown {kind} backend {name!r}; choose one of {', '.join(get_args(names))}"
    )


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)


class TemporalSettings(_Section):
    address: str = Field(default="127.0.0.1:7233", min_length=3)
    """gRPC address of the Temporal frontend."""
    namespace: str = Field(default="default", min_length=1)
    """Temporal namespace."""
    ui_port: int = Field(default=8233, ge=1, le=65535)
    """Web UI port of the embedded dev server."""
    http_port: int = Field(default=7243, ge=1, le=65535)
    """HTTP API port of the embedded dev server."""


class S3Settings(_Section):
    endpoint: str | None = "http://127.0.0.1:8333"
    """S3 endpoint URL; None means AWS's default endpoint for `region`."""
    region: str = Field(default="us-east-1", min_length=1)
    """Region name sent to the endpoint."""
    bucket: str = Field(default="tempered", min_length=3, max_length=63)
    """Bucket holding code, logs, trajectories and checkpoints (created by `tempered up`)."""
    access_key: str = "tempered"
    """Access key id (the embedded SeaweedFS is started with these credentials)."""
    secret_key: SecretStr = SecretStr("tempered-secret")
    """Secret access key."""
    connect_timeout_s: float = Field(default=3.0, gt=0, le=120)
    """Connect timeout of one S3 request."""
    max_attempts: int = Field(default=3, ge=1, le=20)
    """botocore retry attempts before an error surfaces (then the activity retries)."""
    embedded_base_port: int = Field(default=9333, ge=1024, le=22000)
    """First of the embedded SeaweedFS's five internal HTTP ports (its gRPC ports are each
    +10000: the bound keeps all of them below the kernel's ephemeral range, 32768–60999)."""


# -- sandbox backends --------------------------------------------------------------------------


class LocalSandboxSettings(_Section):
    """The `local` backend: bubblewrap on this host (infra/sandbox/local.py)."""

    python: str = Field(default="/usr/bin/python3", pattern=r"^/")
    """Interpreter inside the sandbox, an absolute path (the system one, never a pyenv shim)."""
    warm: int = Field(default=8, ge=0, le=256)
    """Sandboxes started ahead of time per tmpfs size, at most `sandbox.concurrency`; 0 = off."""


class GVisorSettings(_Section):
    """The `gvisor` backend: runsc containers on this host (infra/sandbox/gvisor.py)."""

    python: str = Field(default="/usr/bin/python3", pattern=r"^/")
    """Interpreter inside the container, an absolute host path (bound read-only with /usr)."""
    platform: Literal["ptrace", "systrap", "kvm"] = "ptrace"
    """runsc `--platform`: ptrace works everywhere; systrap is faster; kvm needs /dev/kvm."""


class KubernetesSandboxSettings(_Section):
    """The `kubernetes` backend: one Job per program (infra/sandbox/kubernetes.py)."""

    namespace: str = Field(default="tempered-sandbox", pattern=DNS_LABEL)
    """Namespace of the sandbox Jobs."""
    image: str = Field(default="python:3.11-slim", min_length=1)
    """Image of the sandbox Jobs: any image with python3 at /usr/local/bin or /usr/bin."""
    runtime_class: str | None = Field(default=None, pattern=DNS_SUBDOMAIN)
    """RuntimeClass of sandbox pods (e.g. gvisor, kata); None = the cluster's default runtime."""


class SandboxSettings(_Section):
    backend: SandboxBackendName = "local"
    """Which sandbox backend the sandbox worker uses."""
    concurrency: int = Field(default=8, ge=1, le=4096)
    """Sandboxed programs the worker runs at once."""
    local: LocalSandboxSettings = LocalSandboxSettings()
    """Settings of the `local` backend."""
    gvisor: GVisorSettings = GVisorSettings()
    """Settings of the `gvisor` backend."""
    kubernetes: KubernetesSandboxSettings = KubernetesSandboxSettings()
    """Settings of the `kubernetes` backend."""


# -- inference backends ------------------------------------------------------------------------


class LocalInferenceSettings(_Section):
    """The `local` backend: transformers in the worker process (infra/inference/local.py)."""

    device: str = Field(default="cpu", pattern=TORCH_DEVICE)
    """torch device the policies are loaded on."""
    threads: int = Field(default=0, ge=0, le=1024)
    """torch threads; 0 = torch's default."""
    max_loaded: int = Field(default=2, ge=1, le=64)
    """Policy versions kept loaded at once (least recently used is evicted)."""


class VLLMSettings(_Section):
    """The `vllm` backend: an OpenAI-compatible vLLM server (infra/inference/vllm.py)."""

    url: str = Field(default="http://127.0.0.1:8000/v1", pattern=r"^https?://[^/\s]+")
    """Base URL of the server's OpenAI API (`/completions` is appended)."""
    timeout_s: float = Field(default=600.0, gt=0, le=3600)
    """Total time one completion request may take."""
    connect_timeout_s: float = Field(default=10.0, gt=0, le=300)
    """Time to open the connection to the server."""


class InferenceSettings(_Section):
    backend: InferenceBackendName = "local"
    """local: transformers in the worker; vllm: an OpenAI-compatible vLLM server."""
    base_model: str = Field(default="smollm2", min_length=1)
    """Policy published as version 0 of a run that has none yet (e.g. a task started by hand)."""
    max_batch: int = Field(default=32, ge=1, le=4096)
    """Most sequences coalesced into one generate call."""
    max_wait_ms: int = Field(default=20, ge=0, le=10000)
    """How long a request waits for others to join its batch."""
    local: LocalInferenceSettings = LocalInferenceSettings()
    """Settings of the `local` backend."""
    vllm: VLLMSettings = VLLMSettings()
    """Settings of the `vllm` backend."""


class LearnerSettings(_Section):
    device: str = Field(default="cpu", pattern=TORCH_DEVICE)
    """Device of the DeepSpeed engine (cpu uses gloo)."""
    threads: int = Field(default=0, ge=0, le=1024)
    """torch threads; 0 = torch's default."""


class TelemetrySettings(_Section):
    otlp_endpoint: str | None = None
    """OTLP gRPC endpoint; None writes JSONL under the state dir instead."""
    prometheus_port: int = Field(default=0, ge=0, le=65535)
    """Base port of per-worker Prometheus endpoints; 0 disables them."""
    prometheus_host: str = "127.0.0.1"
    """Address the Prometheus endpoints bind to (0.0.0.0 in a pod, so Prometheus can scrape)."""


def _local_config() -> Path | None:
    local = Path(LOCAL_CONFIG)
    return local.resolve() if local.is_file() else None


class Settings(BaseSettings):
    """All configuration of Tempered."""

    model_config = SettingsConfigDict(
        env_prefix="TEMPERED_",
        env_nested_delimiter="__",
        extra="forbid",
        toml_file=None,
        use_attribute_docstrings=True,
    )

    config: FilePath | None = Field(default_factory=_local_config)
    """TOML file these settings were read from (`$TEMPERED_CONFIG`; default ./tempered.toml)."""
    home: Path = Field(default_factory=lambda: Path.cwd() / ".tempered")
    """State directory: server databases, pids, logs, caches, reports (`$TEMPERED_HOME`;
    default `.tempered` in the working directory, the repo root for `make train`)."""
    temporal: TemporalSettings = TemporalSettings()
    """Where the Temporal server is."""
    s3: S3Settings = S3Settings()
    """Where the object store is."""
    sandbox: SandboxSettings = SandboxSettings()
    """How model-written code runs."""
    inference: InferenceSettings = InferenceSettings()
    """How completions are sampled."""
    learner: LearnerSettings = LearnerSettings()
    """Where the learner trains."""
    telemetry: TelemetrySettings = TelemetrySettings()
    """Where traces and metrics go."""

    @field_validator("config", "home", mode="after")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        """Absolute, so worker processes started elsewhere see the same files."""
        return None if path is None else path.expanduser().absolute()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        named = None
        if isinstance(init_settings, InitSettingsSource):
            named = init_settings.init_kwargs.get("config")
        path = named or os.environ.get("TEMPERED_CONFIG") or _local_config()
        if not path:
            return init_settings, env_settings
        if not Path(path).is_file():
            raise ValueError(f"settings file {path} does not exist")
        try:
            toml = TomlConfigSettingsSource(settings_cls, Path(path))
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path}: not valid TOML ({exc})") from None
        return init_settings, env_settings, toml


def load_settings(config: str | Path | None = None, **overrides: Any) -> Settings:
    """Settings from overrides > env > TOML (`config`, else $TEMPERED_CONFIG) > defaults.

    Raises ValueError with one line naming every bad field (or the file that is not TOML).
    """
    if config is not None:
        overrides["config"] = Path(config)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ValueError(describe_validation_error(exc)) from None
