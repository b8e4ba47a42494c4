"""Which failed loads of a version the `vllm` backend counts against it (two in a row,
`LOAD_RETRY_S` apart, make it final): its weights failing to load and a config the engine refuses
count; an engine that will not start (its memory not back after a death) never does, however
often. Counted, a short run of start failures made a version whose weights were fine final: its
run failed for good, the message blaming the checkpoint. On a fake `AsyncLLM` (no engine starts):
test_vllm_review.py's `builds`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from infra.inference import InferenceError, PolicyHandle
from infra.inference.gate import VersionGate
from infra.inference.vllm import VLLMBackend
from infra.settings import VLLMSettings
from tests.infra.inference.test_vllm_review import (  # noqa: F401 (a fixture)
    Builds,
    builds,
    versions,
)

Serve = Callable[[PolicyHandle], Awaitable[None]]
OOM = "Engine core initialization failed: CUDA out of memory (the old engine's not freed yet)"


def serving(backend: VLLMBackend) -> tuple[VersionGate[PolicyHandle], Serve]:
    """The backend's gate, and a request for a version through it (it loads the version)."""
    gate = VersionGate(backend._load, wait_s=5.0)

    async def serve(policy: PolicyHandle) -> None:
        async with gate.serving(policy):
            pass

    return gate, serve


@pytest.mark.asyncio
async def test_an_engine_that_will_not_start_never_makes_a_version_final(
    tmp_path: Path,
    builds: Builds,  # noqa: F811
) -> None:
    version = versions(tmp_path)
    backend = VLLMBackend(VLLMSettings(), load_retry_s=0.0)  # every counted failure counts
    gate, serve = serving(backend)
    await serve(version(5))
    backend._engine.errored = True  # the engine core died serving v5
    gate.invalidate()
    for _ in range(4):  # memory not back yet, rebuild after rebuild
        builds.append(RuntimeError(OOM))
        with pytest.raises(InferenceError, match="the engine did not start") as failed:
            await serve(version(5))
        assert failed.value.retryable and "failed to load" not in str(failed.value)
    assert not backend._load_failures
    await serve(version(5))  # memory is back: v5's weights were fine all along
    assert backend._engine is builds[-1] and builds[-1].calls[-1] == ("version", "run/v5")


@pytest.mark.asyncio
async def test_weights_that_fail_to_load_count_though_the_engine_is_rebuilt(
    tmp_path: Path,
    builds: Builds,  # noqa: F811
) -> None:
    """The rebuild after a failed reload (vLLM's reload state is left half-built) starts the
    engine on a checkpoint it has started on, then loads the version into it: a version whose
    weights do not load is told from an engine that does not start."""
    version = versions(tmp_path)
    backend = VLLMBackend(VLLMSettings(), load_retry_s=0.0)
    gate, serve = serving(backend)
    await serve(version(0))
    broken = version(2)
    builds.broken[broken.path] = RuntimeError("safetensors: invalid header")
    with pytest.raises(InferenceError, match="run/v2 failed to load") as once:
        await serve(broken)
    assert once.value.retryable and backend._engine is None  # half-built: gone
    with pytest.raises(InferenceError, match="run/v2 failed to load.*2 times") as twice:
        await serve(broken)
    assert not twice.value.retryable
    assert [e.model for e in builds] == [version(0).path, version(0).path]
    assert ("reload_weights", broken.path) in builds[-1].calls

    await serve(version(3))  # counted per version: another loads
    assert builds[-1].calls[-1] == ("version", "run/v3")
    builds[-1].errored = True  # died; a start failure on the way to v4 is not v4's
    builds.append(RuntimeError(OOM))
    gate.invalidate()
    with pytest.raises(InferenceError, match="did not start") as start:
        await serve(version(4))
    assert start.value.retryable and "run/v4" not in backend._load_failures
    await serve(version(4))


@pytest.mark.asyncio
async def test_a_config_the_engine_refuses_counts_a_new_architecture_that_will_not_start_not(
    tmp_path: Path,
    builds: Builds,  # noqa: F811
) -> None:
    """A version of another architecture has no checkpoint to start on but its own: an engine
    core that dies starting on it is retried; vLLM refusing its config (a `ValueError`, raised
    before any engine process starts) is the version's."""
    version = versions(tmp_path)
    backend = VLLMBackend(VLLMSettings(), load_retry_s=0.0)
    _, serve = serving(backend)
    await serve(version(0))

    def other(n: int, **config: object) -> PolicyHandle:
        path = tmp_path / f"other{n}"
        path.mkdir()
        (path / "config.json").write_text(json.dumps({"vocab_size": 50, **config}))
        return PolicyHandle("other", n, path)

    big = other(1, hidden_size=128)
    for _ in range(3):
        builds.append(RuntimeError(OOM))
        with pytest.raises(InferenceError, match="did not start") as start:
            await serve(big)
        assert start.value.retryable
    await serve(big)
    assert builds[-1].model == big.path

    odd = other(2, hidden_size=64, model_type="k2-no-such-model")
    refused = ValueError("Model architectures ['K2ForCausalLM'] are not supported for now.")
    builds.append(refused)
    with pytest.raises(InferenceError, match="other/v2 failed to load") as once:
        await serve(odd)
    assert once.value.retryable
    builds.append(refused)
    with pytest.raises(InferenceError, match="are not supported for now") as twice:
        await serve(odd)
    assert not twice.value.retryable
