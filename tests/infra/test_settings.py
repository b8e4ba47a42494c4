"""The settings model: a sub-model per backend, env nesting, TOML files, clear errors, bounds.

Every test runs in an empty working directory with no `TEMPERED_*` variables set, so what the
developer's shell or checkout holds never leaks in.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from infra.inference import get_backend as inference_backend
from infra.inference.vllm import VLLMBackend
from infra.sandbox import get_backend as sandbox_backend
from infra.sandbox.gvisor import GVisorBackend
from infra.sandbox.local import LocalBackend
from infra.settings import (
    GVisorSettings,
    KubernetesSandboxSettings,
    LocalInferenceSettings,
    LocalSandboxSettings,
    Settings,
    TelemetrySettings,
    VLLMSettings,
    load_settings,
)

pytestmark = pytest.mark.usefixtures("clean")  # tests/fixtures/settings_env.py


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_each_backend_has_its_own_sub_model() -> None:
    settings = Settings()
    assert isinstance(settings.sandbox.local, LocalSandboxSettings)
    assert isinstance(settings.sandbox.gvisor, GVisorSettings)
    assert isinstance(settings.sandbox.kubernetes, KubernetesSandboxSettings)
    assert isinstance(settings.inference.local, LocalInferenceSettings)
    assert isinstance(settings.inference.vllm, VLLMSettings)
    # the shared knobs stay where every caller reads them
    assert (settings.sandbox.backend, settings.sandbox.concurrency) == ("local", 8)
    assert (settings.inference.backend, settings.inference.max_activities) == ("local", 256)
    assert "python" not in type(settings.sandbox).model_fields  # no backend field left on top
    assert "device" not in type(settings.inference).model_fields


def test_nested_env_reaches_each_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPERED_SANDBOX__KUBERNETES__IMAGE", "registry.example/py:3.11")
    monkeypatch.setenv("TEMPERED_SANDBOX__KUBERNETES__RUNTIME_CLASS", "gvisor")
    monkeypatch.setenv("TEMPERED_SANDBOX__GVISOR__PLATFORM", "systrap")
    monkeypatch.setenv("TEMPERED_INFERENCE__VLLM__KV_CACHE_GIB", "1.5")
    monkeypatch.setenv("TEMPERED_INFERENCE__LOCAL__THREADS", "3")
    settings = load_settings()
    assert settings.sandbox.kubernetes.image == "registry.example/py:3.11"
    assert settings.sandbox.kubernetes.runtime_class == "gvisor"
    assert settings.sandbox.gvisor.platform == "systrap"
    assert settings.inference.vllm.kv_cache_gib == 1.5
    assert settings.inference.local.threads == 3


def test_a_flat_pre_split_name_is_an_error_not_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPERED_SANDBOX__KUBERNETES_IMAGE", "python:3.12-slim")
    with pytest.raises(ValueError) as caught:
        load_settings()
    assert str(caught.value) == (
        "environment variable TEMPERED_SANDBOX__KUBERNETES_IMAGE names no setting (did you mean "
        "TEMPERED_SANDBOX__KUBERNETES__IMAGE?)"
    )


def test_toml_file_is_read_without_touching_the_environment(
    clean: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write(
        clean / "my.toml",
        "[sandbox]\nconcurrency = 3\n[sandbox.local]\nwarm = 0\n"
        '[inference]\nbackend = "vllm"\nvllm.max_num_seqs = 16\n',
    )
    before = dict(os.environ)
    settings = load_settings(path)
    assert dict(os.environ) == before
    assert settings.config == path
    assert (settings.sandbox.concurrency, settings.sandbox.local.warm) == (3, 0)
    assert (settings.inference.backend, settings.inference.vllm.max_num_seqs) == ("vllm", 16)
    assert Settings().sandbox.concurrency == 8  # nothing of that file lingers
    monkeypatch.setenv("TEMPERED_SANDBOX__CONCURRENCY", "5")  # env outranks the file …
    assert load_settings(path).sandbox.concurrency == 5
    assert load_settings(path, sandbox={"concurrency": 6}).sandbox.concurrency == 6  # … args it


def test_config_from_env_then_the_working_directory(
    clean: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert Settings().config is None
    local = write(clean / "tempered.toml", "[sandbox]\nconcurrency = 2\n")
    assert (Settings().config, Settings().sandbox.concurrency) == (local, 2)
    named = write(clean / "named.toml", "[sandbox]\nconcurrency = 4\n")
    monkeypatch.setenv("TEMPERED_CONFIG", str(named))
    assert (Settings().config, Settings().sandbox.concurrency) == (named, 4)


def test_home_is_tempered_home_else_the_working_directory(
    clean: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert Settings().home == clean / ".tempered"
    monkeypatch.setenv("TEMPERED_HOME", "state")
    assert Settings().home == clean / "state"  # absolute, so workers started elsewhere agree
    assert Settings(home=Path("/srv/t")).home == Path("/srv/t")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sandbox": {"concurrency": 0}}, "sandbox.concurrency: Input should be greater than"),
        ({"sandbox": {"kubernetes": {"namespace": "Bad_NS"}}}, "sandbox.kubernetes.namespace:"),
        ({"sandbox": {"local": {"python": "python3"}}}, "sandbox.local.python: String should"),
        ({"sandbox": {"gvisor": {"platform": "hyperv"}}}, "sandbox.gvisor.platform: Input should"),
        ({"inference": {"local": {"device": "gpu"}}}, "inference.local.device: String should"),
        ({"inference": {"vllm": {"max_lora_rank": 12}}}, "inference.vllm.max_lora_rank: Input"),
        ({"inference": {"backend": "tgi"}}, "inference.backend: Input should be 'local' or 'vllm'"),
        # batching moved into the engines (continuous batching): the old knobs are refused
        ({"inference": {"max_batch": 64}}, "inference.max_batch: Extra inputs are not permitted"),
        ({"inference": {"max_wait_ms": 5}}, "inference.max_wait_ms: Extra inputs are not"),
        # `up`, `status`, `train` read its port: "invalid literal for int() with base 10"
        ({"temporal": {"address": "temporal"}}, "temporal.address: Value error, 'temporal' is not"),
        ({"temporal": {"address": "host:http"}}, "temporal.address: Value error, 'host:http' is"),
        ({"temporal": {"address": ":7233"}}, "temporal.address: Value error, ':7233' is not host"),
        ({"temporal": {"address": "h:70000"}}, "temporal.address: Value error, 'h:70000' is not"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        load_settings(**overrides)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_missing_or_broken_file_is_named(clean: Path) -> None:
    with pytest.raises(ValueError, match=r"settings file .*nope\.toml does not exist"):
        load_settings(clean / "nope.toml")
    broken = write(clean / "broken.toml", "[sandbox\n")
    with pytest.raises(ValueError, match=r"broken\.toml: not valid TOML"):
        load_settings(broken)
    misspelt = write(clean / "misspelt.toml", "[sandbox]\nconcurency = 2\n")
    with pytest.raises(ValueError, match=r"^sandbox\.concurency: Extra inputs"):
        load_settings(misspelt)


def _sections(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    found = []
    for name, field in model.model_fields.items():
        found.append((prefix + name, field))
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            found += _sections(field.annotation, f"{prefix}{name}.")
    return found


def test_every_field_has_a_docstring_and_numbers_have_bounds() -> None:
    undocumented = [path for path, field in _sections(Settings) if not field.description]
    assert undocumented == []
    unbounded = []
    for path, field in _sections(Settings):
        if field.annotation in (int, float, int | None, float | None):
            kinds = {type(m).__name__ for m in field.metadata}
            if not ({"Ge", "Gt"} & kinds and {"Le", "Lt"} & kinds):
                unbounded.append(path)
    assert unbounded == []


def test_factories_hand_each_backend_only_its_sub_model() -> None:
    settings = Settings(
        sandbox={
            "concurrency": 3,
            "local": {"python": "/usr/bin/python3", "warm": 20},
            "gvisor": {"platform": "systrap"},
        },
        inference={"backend": "vllm", "vllm": {"max_num_seqs": 9, "enforce_eager": False}},
    )
    local = sandbox_backend(settings)
    assert isinstance(local, LocalBackend)
    assert (local.python, local.warm) == ("/usr/bin/python3", 3)  # the pool never outgrows C
    gvisor = sandbox_backend(settings, "gvisor")
    assert isinstance(gvisor, GVisorBackend) and gvisor.platform == "systrap"
    vllm = inference_backend(settings, start=False)  # starting it takes tens of seconds
    assert isinstance(vllm, VLLMBackend)
    assert vllm.config is settings.inference.vllm
    with pytest.raises(ValueError, match="unknown sandbox backend 'docker'; choose one of local"):
        sandbox_backend(settings, "docker")
    with pytest.raises(ValueError, match="unknown inference backend 'tgi'; choose one of local"):
        inference_backend(settings, "tgi")


def test_an_otlp_endpoint_without_a_scheme_is_refused_where_it_is_set() -> None:
    """`127.0.0.1:4317` failed Temporal's runtime at every worker's start, and `localhost:4317`
    made the exporter speak TLS to a plaintext collector: refused when the settings load."""
    with pytest.raises(ValidationError, match="write http://127.0.0.1:4317"):
        TelemetrySettings(otlp_endpoint="127.0.0.1:4317")
    assert TelemetrySettings(otlp_endpoint="http://collector:4317").otlp_endpoint
