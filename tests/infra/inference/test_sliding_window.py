"""A sliding-window model on the local backend (a random tiny Mistral, window 8): prompts longer
than the window, rows joining a running batch, and a next step prefilled from a stored prefix
decode what transformers' own full forward computes (the learner's), log-prob for log-prob.

Its own cache keeps a sliding layer's last `WINDOW - 1` columns only, which the batch's cache
could not take: a prompt longer than the window failed the whole running batch, retried for
ever. `infra.inference.decoder` prefills into layers that hold every column; the window is the
attention mask's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from contracts.task import SamplingParams
from infra.inference import decoder_thread
from infra.inference.decoder import Row, RowBatch
from infra.inference.local import LoadedPolicy, _choose, load_policy, sample_batch
from infra.inference.prefixes import PrefixStore
from tests.infra.inference.test_decoder import wait_until
from tests.infra.inference.test_kvcache import prompt

WINDOW = 8
TOLERANCE = 1e-4
"""As the tiny preset's decoding against its full forward (tests/infra/inference/test_kvcache.py)."""


@pytest.fixture(scope="module")
def mistral_dir(tmp_path_factory: pytest.TempPathFactory, tiny_dir: Path) -> Path:
    """A random 2-layer Mistral of window `WINDOW`, with the tiny preset's byte tokenizer."""
    from transformers import AutoTokenizer, MistralConfig, MistralForCausalLM

    out = tmp_path_factory.mktemp("mistral-window")
    torch.manual_seed(0)
    MistralForCausalLM(
        MistralConfig(
            vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
            max_position_embeddings=2048, pad_token_id=0, eos_token_id=2, bos_token_id=1,
        )
    ).save_pretrained(out)  # fmt: skip
    AutoTokenizer.from_pretrained(str(tiny_dir)).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def sliding(mistral_dir: Path) -> LoadedPolicy:
    """The model as the local backend loads it, without EOS (every row runs its budget)."""
    policy = load_policy(str(mistral_dir), torch.device("cpu"))
    assert policy.model.config.sliding_window == WINDOW
    return dataclasses.replace(policy, eos_ids=frozenset())


@pytest.fixture(scope="module")
def reference(mistral_dir: Path) -> Any:
    """The same weights under transformers' own attention, as the learner loads them."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(mistral_dir), dtype=torch.float32).eval()


def greedy(tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=tokens)


def assert_as_transformers(reference: Any, prompt_ids: list[int], completion: list[int],
                           logprobs: list[float]) -> None:  # fmt: skip
    """The log-probs recorded are the full forward's over the prompt and completion."""
    assert len(prompt_ids) + len(completion) > WINDOW  # the window is in play
    with torch.inference_mode():
        logits = reference(input_ids=torch.tensor([prompt_ids + completion])).logits[0]
    forced = torch.log_softmax(logits[len(prompt_ids) - 1 : -1].float(), dim=-1)
    expected = forced.gather(-1, torch.tensor(completion)[:, None])[:, 0]
    assert (expected - torch.tensor(logprobs)).abs().max() < TOLERANCE


def assert_rows(reference: Any, rows: list[Row]) -> None:
    for row in rows:
        out = row.output
        assert_as_transformers(reference, row.prompt, out.token_ids, out.logprobs)


def test_prompts_longer_than_the_window_decode_as_transformers(
    sliding: LoadedPolicy, reference: Any
) -> None:
    prompts = [prompt(30, 1), prompt(5, 2), prompt(WINDOW, 3), prompt(13, 4)]
    outputs = sample_batch(sliding, prompts, [greedy(20)] * len(prompts))
    for p, out in zip(prompts, outputs, strict=True):
        assert len(out.token_ids) == 20
        assert_as_transformers(reference, p, out.token_ids, out.logprobs)


def test_rows_joining_and_leaving_past_the_window_decode_as_transformers(
    sliding: LoadedPolicy, reference: Any
) -> None:
    batch = RowBatch(sliding, _choose)
    first = [batch.row(prompt(20, 5), greedy(30)), batch.row(prompt(5, 6), greedy(6))]
    batch.admit(first)
    for _ in range(6):  # the short row ends and leaves
        batch.step()
    joiners = [batch.row(prompt(4, 7), greedy(15)), batch.row(prompt(50, 8), greedy(10))]
    batch.admit(joiners)  # the longer one widens the batch
    while batch.rows:
        batch.step()
    assert_rows(reference, first + joiners)


def test_a_next_step_from_a_stored_prefix_decodes_as_transformers(
    sliding: LoadedPolicy, reference: Any
) -> None:
    store = PrefixStore(max_bytes=64 << 20)
    batch = RowBatch(sliding, _choose, store.version("v1"))
    firsts = [batch.row(prompt(12, s), greedy(10)) for s in (9, 10)]
    batch.admit(firsts)
    while batch.rows:
        batch.step()
    nexts = [
        batch.row(r.prompt + r.output.token_ids + prompt(6, 11 + s), greedy(12))
        for s, r in enumerate(firsts)
    ]
    batch.admit(nexts)
    assert store.hits == 2
    while batch.rows:
        batch.step()
    assert_rows(reference, firsts + nexts)


def test_a_prompt_longer_than_the_window_joins_a_running_batch_on_the_decoder(
    sliding: LoadedPolicy, reference: Any
) -> None:
    """Through the local backend's decoder thread: neither the long row nor a row decoding
    beside it fails (the prefill's fault failed both, retryable, every try)."""
    batches: list[RowBatch] = []

    def start(key: object) -> RowBatch:
        batches.append(RowBatch(sliding, _choose))
        return batches[-1]

    engine = decoder_thread.Decoder(max_rows=8, start=start)
    try:
        first = prompt(5, 12)
        healthy = engine.submit("v", first, greedy(120))
        wait_until(lambda: bool(batches) and len(batches[0].rows) == 1)
        long = prompt(40, 13)
        joiner = engine.submit("v", long, greedy(6)).result(timeout=60)
        assert len(joiner.token_ids) == 6 and len(batches) == 1  # it joined `healthy`'s batch
        assert_as_transformers(reference, long, joiner.token_ids, joiner.logprobs)
        out = healthy.result(timeout=120)
        assert len(out.token_ids) == 120
        assert_as_transformers(reference, first, out.token_ids, out.logprobs)
    finally:
        engine.close()
