"""A version the local backend cannot load fails its rows for good where the loader refuses files
that are all there (an unknown model_type, a LoRA adapter aimed at modules the model lacks) and
is retried where a file is missing (the cache evicted it): both used to be retried, so the
episode's GENERATE retried for ever. The `tiny` preset, real transformers and peft."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from contracts.task import SamplingParams
from infra.inference import InferenceError, PolicyHandle, PolicyResolver
from infra.inference.local import LocalBackend
from infra.policy import publish_policy
from infra.settings import LocalInferenceSettings
from infra.storage import ObjectStore
from tests.infra.inference.policies import lora_adapter

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=2)


async def refusal(backend: LocalBackend, handle: PolicyHandle) -> InferenceError:
    """The error a row of `handle` fails with."""
    with pytest.raises(InferenceError) as err:
        await backend.generate([[5, 6, 7]], [GREEDY], handle)
    return err.value


def edited(source: Path, out: Path, name: str, **changes: object) -> Path:
    """A copy of `source` whose JSON file `name` has `changes`."""
    assert out.name.startswith("k2-") and not out.exists()
    shutil.copytree(source, out)
    config = json.loads((out / name).read_text())
    (out / name).write_text(json.dumps({**config, **changes}))
    return out


@pytest.mark.asyncio
async def test_an_unknown_model_type_fails_for_good(tiny_dir: Path, tmp_path: Path) -> None:
    path = edited(tiny_dir, tmp_path / "k2-unknown", "config.json", model_type="k2-no-such-model")
    backend = LocalBackend(LocalInferenceSettings(threads=1))
    try:
        error = await refusal(backend, PolicyHandle("odd", 0, path))
        assert not error.retryable
        assert str(error) == (
            f"cannot load policy odd/v0 from {path}: ValueError: The checkpoint you are trying "
            "to load has model type `k2-no-such-model` but Transformers does not recognize this "
            "architecture. This could be because of an issue with the checkpoint, or because "
            "your version of Transformers is out of date."
        )
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_an_adapter_for_modules_the_model_lacks_fails_for_good(
    tiny_dir: Path, tmp_path: Path
) -> None:
    adapter = lora_adapter(tiny_dir, tmp_path / "k2-lora", seed=1)
    aimed = edited(
        adapter, tmp_path / "k2-aimed", "adapter_config.json", target_modules=["k2_missing_proj"]
    )
    base = PolicyHandle("lora", 0, tiny_dir)
    backend = LocalBackend(LocalInferenceSettings(threads=1))
    try:
        error = await refusal(backend, PolicyHandle("lora", 1, aimed, base))
        assert not error.retryable
        assert str(error) == (
            f"cannot load LoRA policy lora/v1 from {aimed}: NoMatchingPeftModuleError: Target "
            "modules {'k2_missing_proj'} not found in the base model. Please check the target "
            "modules and try again."
        )
        # the base and a sound adapter over it still serve
        (output,) = await backend.generate([[5, 6, 7]], [GREEDY], base)
        assert len(output.token_ids) == 2
        sound = PolicyHandle("lora", 2, adapter, base)
        (output,) = await backend.generate([[5, 6, 7]], [GREEDY], sound)
        assert len(output.token_ids) == 2
        # the refused adapter added to a base that already carries one: refused alike
        error = await refusal(backend, PolicyHandle("lora", 3, aimed, base))
        assert not error.retryable and "k2_missing_proj" in str(error)
    finally:
        await backend.close()


def without(source: Path, out: Path, name: str) -> Path:
    """A copy of `source` without its file `name`."""
    assert out.name.startswith("k2-") and not out.exists()
    shutil.copytree(source, out)
    (out / name).unlink()
    return out


@pytest.mark.asyncio
async def test_a_load_that_misses_a_file_is_retried(tiny_dir: Path, tmp_path: Path) -> None:
    """A missing file may come right once the version is fetched again. peft tells a missing
    adapter_config.json, and transformers a missing config.json, with a ValueError, as they
    tell a refusal; a missing weights shard is an OSError."""
    adapter = lora_adapter(tiny_dir, tmp_path / "k2-lora", seed=1)
    base = PolicyHandle("gone", 0, tiny_dir)
    missing = {
        1: without(adapter, tmp_path / "k2-configless-lora", "adapter_config.json"),
        2: tmp_path / "k2-never-fetched",
        3: without(tiny_dir, tmp_path / "k2-configless", "config.json"),
        4: without(tiny_dir, tmp_path / "k2-shardless", "model-layer-0001.safetensors"),
    }
    backend = LocalBackend(LocalInferenceSettings(threads=1))
    try:
        error = await refusal(backend, PolicyHandle("gone", 1, missing[1], base))
        assert error.retryable and str(error).startswith(
            f"cannot load LoRA policy gone/v1 from {missing[1]}: ValueError: Can't find"
        )
        for version in (2, 3, 4):
            error = await refusal(backend, PolicyHandle("gone", version, missing[version]))
            assert error.retryable, version
            assert str(error).startswith(f"cannot load policy gone/v{version} from")
    finally:
        await backend.close()


@pytest.mark.asyncio
async def test_a_cached_version_is_refused_for_good_only_while_its_files_are_all_there(
    store: ObjectStore, tiny_dir: Path, tmp_path: Path
) -> None:
    """Versions fetched by the resolver from SeaweedFS: one that names no known model_type is
    refused for good; one that lost a file its manifest lists is retried, although the
    tokenizer tells the missing tokenizer.json with a ValueError."""
    unknown = edited(tiny_dir, tmp_path / "k2-unknown", "config.json", model_type="k2-none")
    publish_policy(store, "cached", 0, unknown)
    publish_policy(store, "cached", 1, tiny_dir, step=1)
    policies = PolicyResolver(store, tmp_path / "k2-cache")
    refused, sound = await policies.resolve("cached", 0), await policies.resolve("cached", 1)
    lost = sound.path / "tokenizer.json"
    assert lost.is_relative_to(tmp_path / "k2-cache")
    lost.unlink()
    backend = LocalBackend(LocalInferenceSettings(threads=1))
    try:
        error = await refusal(backend, refused)
        assert not error.retryable and "model type `k2-none`" in str(error)
        error = await refusal(backend, sound)
        assert error.retryable
        assert str(error).startswith(
            f"cannot load policy cached/v1 from {sound.path}: ValueError: Couldn't instantiate "
            "the backend tokenizer"
        )
    finally:
        await backend.close()
