"""The one settings model of Tempered: a section per concern, a sub-model per backend.

Values come, highest priority first, from constructor arguments, `TEMPERED_*` environment
variables (nested with `__`, e.g. `TEMPERED_S3__ENDPOINT`, `TEMPERED_SANDBOX__KUBERNETES__IMAGE`),
the TOML file named by `config` (`load_settings(path)`, else `$TEMPERED_CONFIG`, else
`tempered.toml` in the working directory when there is one), then the defaults below (the
file and the `TEMPERED_` names are checked by infra/settings_env.py).

    from infra.settings import load_settings
    settings = load_settings()                   # or load_settings("my.toml", home=tmp)
    settings.sandbox.kubernetes.image            # a backend reads only its own sub-model

Each backend gets only its sub-model (`settings.sandbox.local`, `.gvisor`, `.kubernetes`,
`settings.inference.local`, `.vllm`; defined in infra/settings_backends.py, imported from here);
the factories `infra.sandbox.get_backend` and `infra.inference.get_backend` hand it over. Loading never writes `os.environ`: a process that
starts workers passes `settings.config` and `settings.home` on explicitly.
"""

from __future__ import annotations

import ipaddress
import os
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal, get_args
from urllib.parse import urlsplit

from pydantic import (
    BeforeValidator,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from contracts.task import MAX_MEMORY_MB, MIN_MEMORY_MB
from infra.seaweed import MAX_BASE_PORT
from infra.settings_backends import (
    TORCH_DEVICE,
    GVisorSettings,
    KubernetesSandboxSettings,
    LocalInferenceSettings,
    LocalSandboxSettings,
    Section,
    VLLMSettings,
)
from infra.settings_env import (
    AbsoluteFile,
    AbsolutePath,
    check_environment,
    describe_invalid,
    local_config,
    origins,
    toml_sources,
)
from infra.telemetry_export import check_otlp_endpoint

SandboxBackendName = Literal["local", "gvisor", "kubernetes"]
InferenceBackendName = Literal["local", "vllm"]


def unknown_backend(kind: str, name: str, names: Any) -> ValueError:
    """The error for a backend `name` that is none of the Literal `names` (for the factories)."""
    return ValueError(
        f"unknown {kind} backend {name!r}; choose one of {', '.join(get_args(names))}"
    )


class TemporalSettings(Section):
    address: str = Field(default="127.0.0.1:7233", min_length=3, max_length=1024)
    """gRPC address of the Temporal frontend, `host:port`."""
    embedded: bool = True
    """Whether `address` is the embedded dev server, which `tempered up` starts and `down` stops.
    False: a Temporal run elsewhere (a cluster, e.g. the Helm chart's workers', a server of your
    own): `up` and `train` start none (nor its UI's codec server) and only check that it
    answers; `down` leaves it running."""
    namespace: str = Field(default="default", min_length=1)
    """Temporal namespace."""
    ui_port: int = Field(default=8233, ge=1, le=65535)
    """Web UI port of the embedded dev server."""
    http_port: int = Field(default=7243, ge=1, le=65535)
    """HTTP API port of the embedded dev server."""
    codec_port: int = Field(default=8234, ge=1, le=65535)
    """Port of the codec server (`tempered codec`) the embedded dev server's Web UI asks to
    show what payloads' S3 references point to."""
    versioning: Literal["pinned", "off"] = "pinned"
    """Worker versioning of the workflow worker (agent-tasks): `pinned` runs every workflow to
    its end on the build that started it (long-lived ones move on at continue-as-new); `off`
    polls unversioned."""
    deployment: str = Field(default="tempered", min_length=1, max_length=255)
    """Temporal Worker Deployment the workflow worker's builds belong to."""
    build_id: str | None = Field(default=None, min_length=1, max_length=255)
    """Build id of this worker; None = a digest of the workflow code (workflows/, contracts/)."""
    promote: bool = True
    """Make this build the deployment's current version when its worker starts (off where a
    rollout controller, e.g. Temporal's Worker Controller, promotes builds)."""

    @field_validator("address", mode="after")
    @classmethod
    def _host_and_port(cls, address: str) -> str:
        """`host:port` with a port number: `up`, `status` and `train` read the port from it (a
        bare host failed them with "invalid literal for int() with base 10")."""
        host, colon, port = address.rpartition(":")
        if not (colon and host and port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"{address!r} is not host:port (e.g. 127.0.0.1:7233)")
        return address


class S3Settings(Section):
    endpoint: str | None = "http://127.0.0.1:8333"
    """S3 endpoint URL, http(s)://host[:port]; None (or empty) means AWS's default endpoint for
    `region`."""
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
    policy_cache_versions: int = Field(default=6, ge=2, le=100_000)
    """Policy versions this machine keeps in its cache (`home/cache/policies`), across runs;
    the least recently fetched go first (and are fetched again if asked for). Versions share
    the shards they did not change, so the default holds about 1.1 GB of SmolLM2-135M when
    the learner trains its top 6 layers. At least 2: a LoRA version is fetched, then its base,
    and with room for one the base's fetch evicted the adapter just fetched."""
    embedded_base_port: int = Field(default=9333, ge=1024, le=MAX_BASE_PORT)
    """First of the embedded SeaweedFS's five internal HTTP ports (its gRPC ports are each
    +10000: the bound keeps all of them below the kernel's ephemeral range, 32768–60999)."""

    @field_validator("endpoint", mode="after")
    @classmethod
    def _an_http_url(cls, endpoint: str | None) -> str | None:
        """An http(s)://host[:port] URL, or None: `127.0.0.1:8333` passed, and `up` started
        Temporal before it failed "bad S3 endpoint URL …: Invalid endpoint", naming no setting."""
        if not endpoint:
            return None
        parts = urlsplit(endpoint)
        try:
            port_ok = parts.port is None or parts.port > 0
        except ValueError:
            port_ok = False
        if parts.scheme in ("http", "https") and parts.hostname and port_ok:
            return endpoint
        fix = f"http://{endpoint}" if "://" not in endpoint else "http://127.0.0.1:8333"
        raise ValueError(
            f"S3 endpoint {endpoint!r} is not an http(s)://host[:port] URL: write e.g. {fix}, "
            "or leave it empty for AWS"
        )


# -- sandbox (its backends' sub-models: infra/settings_backends.py) ----------------------------


class WorkspaceSettings(Section):
    """Workspace sessions of the sandbox worker (infra/environments/sessions.py)."""

    root: AbsolutePath = Field(
        default_factory=lambda: Path(tempfile.gettempdir()) / "tempered-workspaces"
    )
    """Where session workspaces live on the worker's disk, shared by the workers of a host
    (each starts by removing what dead ones left): Tempered's alone (a directory with anything
    else in it is refused, as is /tmp); its parents must be searchable by others (o+x)."""
    ttl_s: float = Field(default=900.0, ge=10, le=7 * 86400)
    """A session no step touched this long is closed (its last snapshot stays in the store)."""
    max_workspace_mb: int = Field(default=256, ge=1, le=65536)
    """Largest workspace a step may leave (checked when it is snapshotted); with a tmpfs, also
    what a command can write at all."""
    disk: Literal["auto", "tmpfs", "directory"] = "auto"
    """What a workspace is: `tmpfs`, a tmpfs of `max_workspace_mb` of its own (a disk quota: a
    command cannot fill the host's disk; it needs CAP_SYS_ADMIN, and what a workspace holds is
    memory); `directory`, a directory of `root` (its size checked only after each step); `auto`,
    a tmpfs where the worker runs as root, else a directory."""
    max_task_memory_mb: int = Field(default=4096, ge=MIN_MEMORY_MB, le=MAX_MEMORY_MB)
    """Most memory (MB) a task's own limit (Harbor's `[environment] memory_mb`) gives each of its
    sandboxes, steps and checks (`WorkspaceSpec.limits_of`): a task asking more runs within
    this, the worker warning once; never below the run's `limits.memory_mb`. Each of
    `sandbox.concurrency` sandboxes may take it: 4096 × the default 8 is 32 GB at most, where
    an uncapped task could make it 512 GB; a task asking up to 4 GB still has what it asks (a
    default of the run's 512 MB would take back the raise a test that needs 1 GB relies on)."""
    blob_cache_mb: int = Field(default=256, ge=0, le=65536)
    """Memory of the worker's cache of workspace files fetched from or sent to the store; its
    cache of decoded tree manifests takes as much again at most."""
    snapshot_format: int = Field(default=2, ge=1, le=2)
    """How a step's snapshot is stored: 2, as its changes since an earlier snapshot of the
    episode, in the episode's folder (infra/environments/snapshot_chain.py); 1, whole, among
    the shared trees, which is all a sandbox worker of a build before format 2 reads. A fleet
    upgrading from such a build sets 1 until every sandbox worker runs this one (README, Safe
    upgrades)."""


class SandboxSettings(Section):
    backend: SandboxBackendName = "local"
    """Which sandbox backend the sandbox worker uses."""
    concurrency: int = Field(default=8, ge=1, le=4096)
    """Sandboxed programs the worker runs at once, across all its activities: `execute`'s
    programs, workspace checks and steps (a session's open takes one too)."""
    local: LocalSandboxSettings = LocalSandboxSettings()
    """Settings of the `local` backend."""
    gvisor: GVisorSettings = GVisorSettings()
    """Settings of the `gvisor` backend."""
    kubernetes: KubernetesSandboxSettings = KubernetesSandboxSettings()
    """Settings of the `kubernetes` backend."""
    workspaces: WorkspaceSettings = WorkspaceSettings()
    """Workspace sessions of agent episodes (`workspace` tasks)."""


# -- inference (its backends' sub-models: infra/settings_backends.py) --------------------------


class InferenceSettings(Section):
    backend: InferenceBackendName = "local"
    """local: transformers in the worker; vllm: a vLLM engine in the worker."""
    base_model: str = Field(default="smollm2", min_length=1)
    """Policy published as version 0 of a run that has none yet (e.g. a task started by hand),
    and the model the `vllm` engine starts on."""
    policy_wait_s: float = Field(default=600.0, ge=0, le=86400)
    """How long a request for a version that is not published yet waits for it (polling
    `latest.json`) before it fails; also how long a `vllm` request waits for the engine to
    finish the requests of another version and load its own."""
    max_activities: int = Field(default=256, ge=1, le=65536)
    """`generate` activities one worker takes at once. Their rows go straight into the
    backend, whose continuous batch (`local.max_rows`, `vllm.max_num_seqs` wide) takes waiting
    rows in order of `SamplingParams.priority` (a run's evaluations behind its training
    rollouts), so it takes more than fit one batch; with several inference workers, a lower
    figure leaves more of a backlog in the task queue for the others."""
    local: LocalInferenceSettings = LocalInferenceSettings()
    """Settings of the `local` backend."""
    vllm: VLLMSettings = VLLMSettings()
    """Settings of the `vllm` backend."""


class LearnerSettings(Section):
    """The learner worker's DeepSpeed engine (infra/learner_engine.py, infra/learner_ranks.py)."""

    device: str = Field(default="cpu", pattern=TORCH_DEVICE)
    """Device of the DeepSpeed engine: `cpu` (gloo) or `cuda` (NCCL; rank r uses GPU r of those
    CUDA_VISIBLE_DEVICES shows: no index when ranks > 1)."""
    threads: int = Field(default=0, ge=0, le=1024)
    """torch threads of each rank; 0 = torch's default (1 per rank when ranks > 1)."""
    ranks: int = Field(default=1, ge=1, le=64)
    """DeepSpeed ranks (data parallel, ZeRO stage from the run's `GRPOConfig.zero_stage`): 1
    trains in the worker process; N > 1 starts N processes on this host with torchrun (one GPU
    each on cuda), rank 0 taking each step from the worker."""
    start_timeout_s: float = Field(default=300.0, ge=5, le=3600)
    """How long N > 1 ranks may take to start and form their group; longer fails the step
    (retried: the next attempt starts a fresh group)."""
    collective_timeout_s: float = Field(default=600.0, ge=10, le=86400)
    """A rank waiting this long in a collective (a peer died or hung) fails, and the step with
    it; the wait for the next step between steps is not bounded by it. With `start_timeout_s`,
    also how long rank 0 may stay silent during a command before the group is ended."""

    @model_validator(mode="after")
    def _one_gpu_per_rank(self) -> LearnerSettings:
        kind, _, index = self.device.partition(":")
        if self.ranks > 1 and index and kind != "cpu":  # it would be ignored: rank r takes r
            raise ValueError(
                f"device {self.device!r} with ranks = {self.ranks}: rank r takes {kind}:r; set "
                f"device to {kind!r} and choose the GPUs with CUDA_VISIBLE_DEVICES"
            )
        return self


class TelemetrySettings(Section):
    otlp_endpoint: str | None = None
    """OTLP gRPC endpoint, an http:// or https:// URL (a bare host:port would pick TLS, or fail
    Temporal's runtime at start); None falls back to OTEL_EXPORTER_OTLP_ENDPOINT, else writes
    JSONL under the state dir."""

    @field_validator("otlp_endpoint")
    @classmethod
    def _a_url(cls, endpoint: str | None) -> str | None:
        return endpoint and check_otlp_endpoint(endpoint)

    prometheus_port: int = Field(default=0, ge=0, le=65535 - 14)
    """Base port of per-worker Prometheus endpoints; 0 disables them. A worker serves at the
    base plus its queue's offset (0-4) and the SDK's metrics 10 above that: all must be ports."""
    prometheus_host: str = "127.0.0.1"
    """IP address the Prometheus endpoints bind to (0.0.0.0 in a pod, so Prometheus can scrape;
    `::` for every IPv6 and IPv4 address), written bare: no host name (the Temporal SDK's
    runtime takes an address only), no brackets, no port, no zone."""

    @field_validator("prometheus_host", mode="after")
    @classmethod
    def _an_ip_literal(cls, host: str) -> str:
        """An IPv4 or IPv6 address: `localhost` or `::` as written loaded, and the worker then
        exited on the SDK's "Invalid Prometheus address", naming no setting."""
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            address = None
        if address is None or (address.version == 6 and address.scope_id):
            raise ValueError(
                f"{host!r} is not an IP address: write e.g. 0.0.0.0, 127.0.0.1 or :: (no host "
                "name, brackets, port or zone)"
            )
        return host


def _libgomp_default(value: object) -> object:
    """`omp_spin_count`'s None as the environment, a file or the chart write it: "" or
    "default" (any case); anything else goes on to the integer's own checks."""
    if isinstance(value, str) and value.strip().lower() in ("", "default"):
        return None
    return value


class Settings(BaseSettings):
    """All configuration of Tempered."""

    model_config = SettingsConfigDict(
        env_prefix="TEMPERED_",
        env_nested_delimiter="__",
        extra="forbid",
        toml_file=None,
        use_attribute_docstrings=True,
        allow_inf_nan=False,
    )

    config: AbsoluteFile | None = Field(default_factory=local_config)
    """TOML file these settings were read from (`$TEMPERED_CONFIG`; default ./tempered.toml)."""
    home: AbsolutePath = Field(default_factory=lambda: Path.cwd() / ".tempered")
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
    omp_spin_count: Annotated[int | None, BeforeValidator(_libgomp_default)] = Field(
        default=20_000, ge=0, le=1_000_000_000
    )
    """How many turns an idle torch thread of a worker spins for more work before it sleeps
    (libgomp's `GOMP_SPINCOUNT`, set as a worker starts unless the environment sets it or
    `OMP_WAIT_POLICY`). libgomp's own default, 300,000, suits a process with the cores to
    itself; where inference, the learner and sandboxes share a few cores, a spinning thread
    burns the core a neighbour needs (bench/contention.py). None: libgomp's default, written as
    `default` or an empty value (TEMPERED_OMP_SPIN_COUNT="", `omp_spin_count = "default"`)."""

    @property
    def policy_cache(self) -> Path:
        """This machine's cache of published policy versions (infra.policy_cache)."""
        return self.home / "cache" / "policies"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        named, given = None, set(env_settings())  # the fields a higher source than the file gives
        if isinstance(init_settings, InitSettingsSource):
            named = init_settings.init_kwargs.get("config")
            given |= init_settings.init_kwargs.keys()
        return init_settings, env_settings, *toml_sources(settings_cls, named, given)


def load_settings(config: str | Path | None = None, **overrides: Any) -> Settings:
    """Settings from overrides > env > TOML (`config`, else $TEMPERED_CONFIG) > defaults.

    Raises ValueError with one line naming every bad field (its source, the key meant), the
    `TEMPERED_` variables that name none, or the file that cannot be read or is not TOML.
    """
    if config is not None:
        overrides["config"] = Path(config)
    check_environment(Settings, os.environ)
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ValueError(describe_invalid(exc, Settings, origins(overrides, os.environ))) from None
