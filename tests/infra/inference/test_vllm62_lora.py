"""A LoRA version's adapter that vLLM cannot load must fail that version's requests, not the
engine. vLLM 0.32 loads an adapter it does not hold inside the engine core's step: a failure
there (its directory evicted from the policy cache, a rank above `max_lora_rank`, weights or
target modules it does not take) killed the engine: every row in flight failed (other runs'
too), as a retryable "the vLLM engine died", and each retry rebuilt the engine (~70 s) and
killed it again, for ever (the real engine's log: /tmp/review-vllm62/lora_kills_engine.log).
The backend adds each adapter with `add_lora` before each request (a utility call: its
failure is the caller's, the engine lives on), counted as a version's failed load; an adapter
of a rank above `inference.vllm.max_lora_rank` is refused, an evicted one fetched again.

On a fake `AsyncLLM` (`LoraEngine`) that answers as vLLM 0.32 does; no engine starts.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from contracts.task import SamplingParams
from infra.inference import GenerationOutput, InferenceError, PolicyHandle
from infra.inference.gate import VersionGate
from infra.inference.vllm import VLLMBackend
from infra.settings import VLLMSettings
from tests.infra.inference.test_vllm_review import (  # noqa: F401 (a fixture)
    Builds,
    Engine,
    builds,
    versions,
)

pytest.importorskip("vllm")  # `_row` builds vLLM's own SamplingParams
from vllm.exceptions import LoRAAdapterNotFoundError  # noqa: E402
from vllm.v1.engine.exceptions import EngineDeadError  # noqa: E402

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=4)
RANK = 8  # the workers' inference.vllm.max_lora_rank here


class LoraEngine(Engine):
    """`Engine`, plus requests and adapters as vLLM 0.32 serves them: `add_lora` (a utility
    call) loads an adapter or raises its failure, the engine alive; a request whose adapter is
    not loaded loads it inside the engine core's step, where a failure kills the engine: every
    stream in flight then fails with `EngineDeadError`. The adapters held are an LRU of
    `max_cpu_loras` (vllm/lora/worker_manager.py `LRUCacheWorkerLoRAManager.add_adapter`): one
    held is touched, not loaded; one loaded past capacity evicts the least recently used."""

    def __init__(self, args: SimpleNamespace, broken: dict[Path, Exception]) -> None:
        super().__init__(Path(args.model), broken=broken)
        self.max_lora_rank = args.max_lora_rank
        self.capacity = args.max_cpu_loras
        self.adapters: list[int] = []  # least recently used first
        self.label = ""

    def _add_adapter(self, lora: Any) -> None:
        """vLLM's `add_adapter`: touch one held; else load it, then evict the oldest if full."""
        if lora.lora_int_id in self.adapters:
            self.adapters.remove(lora.lora_int_id)
        else:
            self._load_adapter(lora)
            if len(self.adapters) + 1 > self.capacity:
                self.adapters.pop(0)
        self.adapters.append(lora.lora_int_id)

    def _load_adapter(self, lora: Any) -> None:
        """vLLM's worker: the adapter's peft config, its rank, its weights."""
        self.calls.append(("load", lora.lora_name))
        path = Path(lora.lora_path)
        if not (path / "adapter_config.json").is_file():
            raise LoRAAdapterNotFoundError(lora.lora_name, lora.lora_path)
        rank = json.loads((path / "adapter_config.json").read_text())["r"]
        if rank > self.max_lora_rank:
            raise ValueError(f"LoRA rank {rank} is greater than max_lora_rank {RANK}.")
        if (path / "adapter_model.safetensors").read_bytes() == b"broken":
            raise ValueError("target module embed_tokens is not supported")

    async def add_lora(self, lora: Any) -> bool:
        self.calls.append(("add_lora", lora.lora_name))
        await asyncio.sleep(0.005)  # a utility call: answered between the core's steps
        try:
            self._add_adapter(lora)
        except Exception as exc:  # the engine core's answer to a utility call that failed
            raise Exception(
                f"Call to add_lora method failed: Worker failed with error '{exc}'"
            ) from None
        return True

    async def update_weight_version(self, version: str) -> None:
        await super().update_weight_version(version)
        self.label = version

    async def get_weight_version(self) -> str:
        return self.label

    def generate(
        self, prompt: object, params: object, request_id: str, lora_request: Any, priority: int
    ) -> Any:
        async def stream() -> Any:
            for _ in range(5):  # steps: the rows of other requests run beside it
                await asyncio.sleep(0.01)
                if self.errored:
                    raise EngineDeadError()
                if lora_request is not None:  # its adapter, loaded in the step if not held
                    if lora_request.lora_int_id not in self.adapters:
                        self.calls.append(("step_load", lora_request.lora_name))
                    try:
                        self._add_adapter(lora_request)
                    except Exception:  # inside execute_model: the engine core dies
                        self.errored = True
                        raise EngineDeadError() from None
            step = {5: SimpleNamespace(logprob=-0.5)}
            spans = [SimpleNamespace(version=self.label)]
            done = SimpleNamespace(
                token_ids=[5], logprobs=[step], finish_reason="stop", weight_versions=spans
            )
            yield SimpleNamespace(outputs=[done])

        return stream()


def adapter(tmp_path: Path, base: PolicyHandle, n: int, rank: int = RANK) -> PolicyHandle:
    """LoRA version `n` over `base`: a peft config of rank `rank` and its weights."""
    path = tmp_path / f"adapter-v{n}"
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 2 * rank}))
    (path / "adapter_model.safetensors").write_bytes(b"weights")
    return PolicyHandle(base.run_id, n, path, base)


def lora_backend(builds: Builds, max_cpu_loras: int = 8) -> VLLMBackend:  # noqa: F811
    """A backend whose engine is a `LoraEngine` (built by the first request) holding
    `max_cpu_loras` adapters; every counted failure counts (`load_retry_s=0`)."""
    builds.make = LoraEngine
    settings = VLLMSettings(max_lora_rank=RANK, max_loras=1, max_cpu_loras=max_cpu_loras)
    backend = VLLMBackend(settings, load_retry_s=0.0)
    backend._gate = VersionGate(backend._load, wait_s=5.0)
    return backend


async def base_rows(backend: VLLMBackend, base: PolicyHandle) -> list[GenerationOutput]:
    return await backend._generate([[1, 2], [3, 4]], [GREEDY, GREEDY], base)


@pytest.mark.asyncio
async def test_an_adapter_vllm_cannot_load_fails_its_requests_not_the_engine(
    tmp_path: Path,
    builds: Builds,  # noqa: F811
) -> None:
    backend = lora_backend(builds)
    base = versions(tmp_path)(0)
    await base_rows(backend, base)  # the engine is built on the base
    bad = adapter(tmp_path, base, 1)
    (bad.path / "adapter_model.safetensors").write_bytes(b"broken")
    for _ in range(2):
        beside = asyncio.create_task(base_rows(backend, base))  # another run's rows, in flight
        await asyncio.sleep(0.015)
        with pytest.raises(InferenceError, match="run/v1 failed to load") as failed:
            await backend._generate([[1, 2]], [GREEDY], bad)
        assert "died" not in str(failed.value) and "not supported" in str(failed.value)
        assert [o.token_ids for o in await beside] == [[5], [5]]  # served, not killed
        assert not backend._engine.errored and len(builds) == 1
    assert not failed.value.retryable and "failed to load 2 times" in str(failed.value)


@pytest.mark.asyncio
async def test_an_adapter_above_the_max_rank_is_refused_an_evicted_one_fetched_again(
    tmp_path: Path,
    builds: Builds,  # noqa: F811
) -> None:
    backend = lora_backend(builds)
    base = versions(tmp_path)(0)
    await base_rows(backend, base)
    wide = adapter(tmp_path, base, 1, rank=2 * RANK)
    with pytest.raises(InferenceError, match="rank 16.*inference.vllm.max_lora_rank = 8") as big:
        await backend._generate([[1, 2]], [GREEDY], wide)
    assert not big.value.retryable  # no retry of this worker serves it
    evicted = adapter(tmp_path, base, 2)
    (evicted.path / "adapter_config.json").unlink()  # the policy cache evicted it
    for _ in range(3):
        with pytest.raises(InferenceError, match="run/v2") as gone:
            await backend._generate([[1, 2]], [GREEDY], evicted)
        assert gone.value.retryable and "died" not in str(gone.value)
    assert not backend._load_failures  # not the version's fault: the retry fetches it again
    assert not backend._engine.errored and len(builds) == 1
    assert [o.token_ids for o in await base_rows(backend, base)] == [[5], [5]]


@pytest.mark.asyncio
async def test_an_adapter_is_added_before_each_request_loaded_once_per_engine(
    tmp_path: Path,
    builds: Builds,  # noqa: F811
) -> None:
    backend = lora_backend(builds)
    base = versions(tmp_path)(0)
    tuned = adapter(tmp_path, base, 1)
    both = await asyncio.gather(*(backend._generate([[1]], [GREEDY], tuned) for _ in range(3)))
    assert [o.token_ids for (o,) in both] == [[5]] * 3
    assert builds[0].calls.count(("add_lora", "run/v1")) == 1  # shared while in flight
    await backend._generate([[1]], [GREEDY], tuned)  # added again: held, only touched
    assert builds[0].calls.count(("add_lora", "run/v1")) == 2
    assert builds[0].calls.count(("load", "run/v1")) == 1
    builds[0].errored = True  # it died: the next request rebuilds it, and loads the adapter
    assert backend._gate is not None
    backend._gate.invalidate()
    await backend._generate([[1]], [GREEDY], tuned)
    assert len(builds) == 2 and builds[1].calls.count(("load", "run/v1")) == 1


@pytest.mark.asyncio
async def test_an_adapter_vllm_evicted_from_its_lru_is_added_again_before_its_rows(
    tmp_path: Path,
    builds: Builds,  # noqa: F811
) -> None:
    """vLLM holds `max_cpu_loras` adapters, least recently used evicted: a version served
    before and evicted since is added again with `add_lora` (its config checked first), never
    loaded inside a step, where an adapter the policy cache evicted would kill the engine."""
    backend = lora_backend(builds, max_cpu_loras=2)
    base = versions(tmp_path)(0)
    tuned = [adapter(tmp_path, base, n) for n in range(1, 5)]
    for policy in tuned[:3]:  # v3's add_lora evicts v1 (capacity 2)
        await backend._generate([[1]], [GREEDY], policy)
    engine = builds[0]
    assert engine.adapters == [2, 3]
    await backend._generate([[1]], [GREEDY], tuned[0])  # held no more: added again
    assert engine.calls.count(("add_lora", "run/v1")) == 2 and engine.adapters == [3, 1]
    await backend._generate([[1]], [GREEDY], tuned[3])  # evicts v3
    (tuned[2].path / "adapter_config.json").unlink()  # the policy cache evicted v3 too
    with pytest.raises(InferenceError, match="run/v3.*evicted") as gone:
        await backend._generate([[1]], [GREEDY], tuned[2])
    assert gone.value.retryable and "died" not in str(gone.value)
    assert not engine.errored and len(builds) == 1
    assert not [call for call in engine.calls if call[0] == "step_load"]
    assert [o.token_ids for o in await base_rows(backend, base)] == [[5], [5]]
