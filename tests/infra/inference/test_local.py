"""Local transformers backend on the `tiny` preset (a random 2-layer Llama): the decode loop's
contract — seeded reproducibility, greedy = argmax, log-probs = teacher forcing, per-row EOS,
left padding invisible, context budget, a shared prefill, top-p. The backend around it (the
LRU of loaded versions, LoRA, the batcher in front, the order in which waiting rows enter the
running batch) is test_local_backend.py's; the decoder's own request contract is
tests/infra/inference/test_decoder.py's.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch

from contracts.task import SamplingParams
from infra import grpo
from infra.inference.local import (
    NUCLEUS_K,
    LoadedPolicy,
    _choose,
    _nucleus_sample,
    load_policy,
    sample_batch,
)
from infra.inference.stops import StopRules

CPU = torch.device("cpu")


def prompts(n: int) -> list[list[int]]:
    """Prompts of different lengths (byte ids of the tiny vocabulary, 3..258)."""
    return [[3 + (7 * i + 13 * k) % 250 for k in range(5 + 9 * i)] for i in range(n)]


def teacher_forced(
    policy: LoadedPolicy, prompt: list[int], completion: list[int], temperature: float = 1.0
) -> torch.Tensor:
    """The learner's log-prob (`grpo.token_logprobs` at `temperature`) of each completion token,
    the unpadded model run once over prompt + completion."""
    ids = torch.tensor([prompt + completion])
    with torch.inference_mode():
        logits = policy.model(input_ids=ids).logits
    return grpo.token_logprobs(logits, ids, torch.tensor([temperature]))[0, len(prompt) - 1 :]


def test_seeded_sampling_is_reproducible_and_seed_dependent(policy: LoadedPolicy) -> None:
    rows = prompts(3)
    params = [
        SamplingParams(temperature=1.0, top_p=0.95, max_new_tokens=12, seed=s) for s in (1, 2, 3)
    ]
    first = sample_batch(policy, rows, params)
    again = sample_batch(policy, rows, params)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    other = [p.model_copy(update={"seed": p.seed + 100}) for p in params]  # type: ignore[operator]
    assert [o.token_ids for o in sample_batch(policy, rows, other)] != [o.token_ids for o in first]


def test_greedy_picks_the_argmax_every_step(policy: LoadedPolicy) -> None:
    rows = prompts(2)
    params = [SamplingParams(temperature=0.0, max_new_tokens=8)] * 2
    outputs = sample_batch(policy, rows, params)
    assert [o.token_ids for o in outputs] == [
        o.token_ids for o in sample_batch(policy, rows, params)
    ]
    for prompt, output in zip(rows, outputs, strict=True):
        with torch.inference_mode():
            logits = policy.model(input_ids=torch.tensor([prompt + output.token_ids])).logits[0]
        assert logits[len(prompt) - 1 : -1].argmax(-1).tolist() == output.token_ids


def test_logprobs_are_the_learners_at_the_rows_temperature(policy: LoadedPolicy) -> None:
    """What the sampler records is what the learner recomputes: log_softmax(logits / T) at the
    row's temperature (1 when greedy), top-p left out; at T = 1 it would be the log-prob of
    another distribution than the one that drew the token."""
    rows = prompts(4)
    params = [
        SamplingParams(temperature=0.0, max_new_tokens=12),
        SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=12, seed=5),
        SamplingParams(temperature=1.3, top_p=1.0, max_new_tokens=5, seed=6),
        SamplingParams(temperature=1.0, top_p=0.5, max_new_tokens=16, seed=7),
    ]
    outputs = sample_batch(policy, rows, params)
    for prompt, param, output in zip(rows, params, outputs, strict=True):
        assert len(output.token_ids) == len(output.logprobs) == param.max_new_tokens
        assert output.finish_reason == "length"
        expected = teacher_forced(policy, prompt, output.token_ids, param.logprob_temperature)
        assert torch.allclose(torch.tensor(output.logprobs), expected, atol=1e-4)


def test_left_padding_does_not_change_results(policy: LoadedPolicy) -> None:
    rows = prompts(4)
    params = [
        SamplingParams(temperature=t, max_new_tokens=16, seed=i)
        for i, t in enumerate((0.0, 1.0, 0.8, 0.0))
    ]
    batched = sample_batch(policy, rows, params)
    for prompt, param, output in zip(rows, params, batched, strict=True):
        (alone,) = sample_batch(policy, [prompt], [param])
        assert alone.token_ids == output.token_ids
        assert max(abs(a - b) for a, b in zip(alone.logprobs, output.logprobs, strict=True)) < 1e-4


def test_rows_stop_independently_at_eos(policy: LoadedPolicy) -> None:
    rows = prompts(2)
    params = [SamplingParams(temperature=1.0, max_new_tokens=16, seed=s) for s in (11, 12)]
    free = sample_batch(policy, rows, params)
    # Declare a token of row 0 that row 1 never emits an EOS: row 0 must stop right there with
    # "stop", row 1 must run on, unchanged, to its budget.
    stop_at = next(
        k
        for k, t in enumerate(free[0].token_ids)
        if k >= 1 and t not in free[0].token_ids[:k] and t not in free[1].token_ids
    )
    eos = free[0].token_ids[stop_at]
    stopping = dataclasses.replace(policy, eos_ids=frozenset({eos}))
    first, second = sample_batch(stopping, rows, params)
    assert first.token_ids == free[0].token_ids[: stop_at + 1] and first.finish_reason == "stop"
    assert second.token_ids == free[1].token_ids and second.finish_reason == "length"
    assert len(second.token_ids) == 16


def test_a_tool_call_is_detected_when_its_closing_tag_is_written(
    policy: LoadedPolicy, tiny_dir: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dir))
    written = tokenizer.encode(
        '<tool_call>{"name": "submit"}</tool_call>', add_special_tokens=False
    )
    assert policy.stops.closes_tool_call(written)
    assert not policy.stops.closes_tool_call(written[:-1])  # "</tool_call" is not closed yet
    assert not policy.stops.closes_tool_call(tokenizer.encode("a -> b", add_special_tokens=False))


def test_stop_after_tool_call_ends_the_row_at_the_closing_tag(policy: LoadedPolicy) -> None:
    rows = prompts(2)
    params = [SamplingParams(temperature=1.0, max_new_tokens=16, seed=s) for s in (21, 22)]
    free = sample_batch(policy, rows, params)
    # Pretend a token row 0 samples (and row 1 never does) closes a tool call: with the option
    # row 0 stops right after it, row 1 runs on unchanged; without it nothing changes.
    close = next(
        t
        for k, t in enumerate(free[0].token_ids)
        if k >= 1 and t not in free[0].token_ids[:k] and t not in free[1].token_ids
    )
    rules = StopRules(
        frozenset(),
        frozenset({close}),
        lambda ids: '<tool_call>{"name": "submit"}</tool_call>' * (ids[-1] == close),
    )
    stopping = dataclasses.replace(policy, stops=rules)
    tool_params = [p.model_copy(update={"stop_after_tool_call": True}) for p in params]
    first, second = sample_batch(stopping, rows, tool_params)
    at = free[0].token_ids.index(close)
    assert first.token_ids == free[0].token_ids[: at + 1] and first.finish_reason == "stop"
    assert second.token_ids == free[1].token_ids
    assert [o.token_ids for o in sample_batch(stopping, rows, params)] == [
        o.token_ids for o in free
    ]


def test_eos_ids_come_from_both_configs_and_the_pad_falls_back_to_one(
    policy: LoadedPolicy, tiny_dir: Path, tmp_path: Path
) -> None:
    """Models list several EOS ids (Llama 3 and Qwen: a list in generation_config.json) and may
    name no pad id: every id either config names ends a row, and the pad is the smallest."""
    assert policy.eos_ids == {2} and policy.pad_id == 0  # the tiny model names both
    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    for name, eos in (("generation_config.json", [5, 3]), ("config.json", 7)):
        config = json.loads((model / name).read_text())
        config.update(eos_token_id=eos, pad_token_id=None)
        (model / name).write_text(json.dumps(config))
    listed = load_policy(str(model), CPU)
    assert listed.eos_ids == {3, 5, 7} and listed.pad_id == 3


def test_budget_is_clamped_to_the_context(policy: LoadedPolicy) -> None:
    near_full = [5] * (policy.max_context - 3)
    over_full = [5] * policy.max_context
    short, none = sample_batch(
        policy, [near_full, over_full], [SamplingParams(temperature=0.0, max_new_tokens=10)] * 2
    )
    assert len(short.token_ids) == 3 and short.finish_reason == "length"
    assert none.token_ids == [] and none.finish_reason == "length"


def test_temperature_divides_the_logits() -> None:
    rows = 4000
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(rows, 4)
    for temperature in (0.5, 2.0):
        params = [SamplingParams(temperature=temperature, top_p=1.0)] * rows
        generators = [torch.Generator().manual_seed(i) for i in range(rows)]
        picks = _choose(logits.clone(), params, generators)
        counts = torch.bincount(picks, minlength=4).float() / rows
        expected = torch.softmax(logits[0] / temperature, dim=-1)
        assert counts.tolist() == pytest.approx(expected.tolist(), abs=0.03)


def test_top_p_samples_only_the_nucleus_in_proportion() -> None:
    probs = torch.tensor([0.15, 0.5, 0.05, 0.3])
    uniforms = torch.linspace(0.0, 0.999, 1000)
    rows = probs.expand(1000, 4)
    nucleus = _nucleus_sample(rows, torch.full((1000,), 0.7), uniforms)
    assert set(nucleus.tolist()) == {1, 3}  # 0.5 + 0.3 reaches 0.7; 0.15 and 0.05 are cut
    assert (nucleus == 1).sum().item() == pytest.approx(1000 * 0.5 / 0.8, abs=2)
    whole = _nucleus_sample(rows, torch.ones(1000), uniforms)
    counts = torch.bincount(whole, minlength=4).float() / 1000
    assert counts.tolist() == pytest.approx(probs.tolist(), abs=0.002)


def test_a_nucleus_wider_than_the_top_k_is_still_exact() -> None:
    vocab = 4 * NUCLEUS_K
    weights = torch.arange(vocab, 0, -1, dtype=torch.float32)  # token i ∝ vocab - i: sorted
    probs = (weights / weights.sum())[None]
    cdf = probs[0].cumsum(0)
    size = int((cdf < 0.9).sum()) + 1  # the 0.9-nucleus: the top 256 hold 0.44
    assert size > NUCLEUS_K
    for u in (0.0, 0.3, 0.7, 0.999):  # inverse CDF within the whole nucleus
        expected = int(torch.searchsorted(cdf[:size], u * cdf[size - 1], right=True))
        assert int(_nucleus_sample(probs, torch.tensor([0.9]), torch.tensor([u]))) == expected
    assert expected > NUCLEUS_K


def test_samples_of_one_prompt_share_a_prefill_and_still_sample_on_their_own(
    policy: LoadedPolicy,
) -> None:
    prompt, other = prompts(2)
    seeded = [SamplingParams(temperature=1.0, max_new_tokens=10, seed=s) for s in (1, 2, 3)]
    rows = [(prompt, seeded[0]), (other, seeded[0]), (prompt, seeded[1]), (prompt, seeded[2])]
    shared = sample_batch(policy, [r for r, _ in rows], [q for _, q in rows])
    for output, (row, params) in zip(shared, rows, strict=True):
        (alone,) = sample_batch(policy, [row], [params])
        assert output.token_ids == alone.token_ids
        diffs = [abs(a - b) for a, b in zip(output.logprobs, alone.logprobs, strict=True)]
        assert max(diffs) < 1e-5
    assert len({tuple(o.token_ids) for o in (shared[0], shared[2], shared[3])}) == 3
