"""The one settings model of Tempered.

Values come, highest priority first, from constructor arguments, `TEMPERED_*` environment
variables (nested with `__`, e.g. `TEMPERED_S3__ENDPOINT`), the TOML file named by
`TEMPERED_CONFIG` (else `tempered.toml` in the working directory), then the defaults below.

    from infra.settings import load_settings
    settings = load_settings()          # or load_settings("configs/tiny.toml")
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

REPO_ROOT = Path(__file__).resolve().parent.parent


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TemporalSettings(_Section):
    address: str = "127.0.0.1:7233"
    """gRPC address of the Temporal frontend."""
    namespace: str = "default"
    """Temporal namespace."""
    ui_port: int = Field(default=8233, ge=1, le=65535)
    """Web UI port of the embedded dev server."""
    http_port: int = Field(default=7243, ge=1, le=65535)
    """HTTP API port of the embedded dev server."""


class S3Settings(_Section):
    endpoint: str | None = "http://127.0.0.1:8333"
    """S3 endpoint URL; None means AWS's default endpoint for `region`."""
    region: str = "us-east-1"
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
    embedded_base_port: int | None = Field(default=None, ge=1024, le=55000)
    """First of the embedded SeaweedFS's internal ports; None = SeaweedFS's own (9333, …)."""


class SandboxSettings(_Section):
    backend: Literal["local", "gvisor", "kubernetes"] = "local"
    """Which sandbox backend the sandbox worker uses."""
    concurrency: int = Field(default=8, ge=1, le=4096)
    """Sandboxed programs the worker runs at once."""
    python: str = "/usr/bin/python3"
    """Interpreter inside the sandbox (the system one, never a pyenv shim)."""
    kubernetes_namespace: str = "tempered-sandbox"
    """Namespace of sandbox Jobs (kubernetes backend)."""
    kubernetes_image: str = "python:3.11-slim"
    """Image of sandbox Jobs (kubernetes backend)."""
    runtime_class: str | None = None
    """Optional RuntimeClass of sandbox pods (e.g. gvisor, kata)."""


class InferenceSettings(_Section):
    backend: Literal["local", "vllm"] = "local"
    """local: transformers in the worker; vllm: an OpenAI-compatible vLLM server."""
    base_model: str = "smollm2"
    """Policy published as version 0 of a run that has none yet (e.g. a task started by hand)."""
    vllm_url: str = "http://127.0.0.1:8000/v1"
    """Base URL of the vLLM server (vllm backend)."""
    max_batch: int = Field(default=32, ge=1, le=4096)
    """Most sequences coalesced into one generate call."""
    max_wait_ms: int = Field(default=20, ge=0, le=10000)
    """How long a request waits for others to join its batch."""
    device: str = "cpu"
    """torch device of the local backend."""
    threads: int = Field(default=0, ge=0, le=1024)
    """torch threads; 0 = torch's default."""


class LearnerSettings(_Section):
    device: str = "cpu"
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


class Settings(BaseSettings):
    """All configuration of Tempered."""

    model_config = SettingsConfigDict(
        env_prefix="TEMPERED_", env_nested_delimiter="__", extra="forbid", toml_file=None
    )

    home: Path = REPO_ROOT / ".tempered"
    """State directory: server databases, pids, logs, caches, reports."""
    temporal: TemporalSettings = TemporalSettings()
    s3: S3Settings = S3Settings()
    sandbox: SandboxSettings = SandboxSettings()
    inference: InferenceSettings = InferenceSettings()
    learner: LearnerSettings = LearnerSettings()
    telemetry: TelemetrySettings = TelemetrySettings()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _config_path()
        if path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)


def _config_path() -> Path | None:
    named = os.environ.get("TEMPERED_CONFIG")
    if named:
        path = Path(named)
        if not path.is_file():
            raise FileNotFoundError(f"TEMPERED_CONFIG names {path}, which is not a file")
        return path
    local = Path("tempered.toml")
    return local if local.is_file() else None


def load_settings(config: str | Path | None = None, **overrides: Any) -> Settings:
    """Settings from env + TOML (`config` replaces TEMPERED_CONFIG) + explicit overrides."""
    if config is not None:
        os.environ["TEMPERED_CONFIG"] = str(Path(config).resolve())
    home = os.environ.get("TEMPERED_HOME")
    if home and "home" not in overrides:
        overrides["home"] = Path(home)
    return Settings(**overrides)
