"""A group's prompt run once (`grpo_plan.prefix_passes` + `learner_forward.pass_logprobs`) gives the
log-probs, loss and gradient of every row run whole, on the tiny preset's model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from contracts.learner import GRPOConfig
from infra import grpo, grpo_plan
from infra.learner_engine import LearnerEngine
from infra.learner_forward import pass_logprobs, sampled_logprobs
from infra.learner_model import train_only_last_layers
from tests.learner_groups import on_policy_groups


def episode(
    prompt: list[int], turns: list[tuple[list[int], list[int]]], advantage: float
) -> grpo.Row:
    """A row: the prompt, then per turn the sampled tokens and the observation after them."""
    ids, mask, old = list(prompt), [0] * len(prompt), [0.0] * len(prompt)
    for sampled, observation in turns:
        ids += sampled + observation
        mask += [1] * len(sampled) + [0] * len(observation)
        old += [-1.0 - 0.01 * i for i in range(len(sampled))] + [0.0] * len(observation)
    return grpo.Row("t", ids, mask, old, [advantage * m for m in mask])


def tokens(generator: torch.Generator, n: int) -> list[int]:
    return torch.randint(3, 250, (n,), generator=generator).tolist()


def group(seed: int) -> list[grpo.Row]:
    """Six samples of one prompt: one- and two-turn, short and long, two that begin alike."""
    g = torch.Generator().manual_seed(seed)
    prompt = tokens(g, 24)
    alike = tokens(g, 3)
    return [
        episode(prompt, [(tokens(g, 5), [])], 1.0),
        episode(prompt, [(alike + tokens(g, 4), [])], -0.5),
        episode(prompt, [(alike + tokens(g, 9), tokens(g, 30)), (tokens(g, 12), [])], 0.7),
        episode(prompt, [(tokens(g, 20), tokens(g, 25)), (tokens(g, 6), [])], -1.2),
        episode(prompt, [(tokens(g, 1), [])], 0.3),
        episode(prompt, [(tokens(g, 40), [])], -0.3),
    ]


def loss_and_grads(
    model: torch.nn.Module, units: list[grpo_plan.Pass]
) -> tuple[float, list[torch.Tensor]]:
    model.zero_grad()
    total = torch.zeros(())
    for unit in units:
        for logprobs, batch in zip(pass_logprobs(model, unit), unit.batches, strict=True):
            total = total + grpo.grpo_loss(logprobs, batch, clip_eps=0.2)[0]
    total.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return float(total.detach()), grads


@pytest.mark.parametrize("last_layers", [0, 1])
def test_a_shared_prompt_gives_the_whole_rows_loss_and_gradient(
    tiny_dir: Path, last_layers: int
) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    train_only_last_layers(model, last_layers)
    groups = [group(1), group(2)]
    rows = [r for g in groups for r in g]
    grpo.normalize(rows)
    shared = grpo_plan.prefix_passes(groups, size=4, pad_id=0)
    assert [u.prefix for u in shared] == [24, 24, 24, 24]  # the prompt, not the alike tokens
    assert sum(len(b.input_ids) for u in shared for b in u.batches) == 12
    plain = grpo_plan.plain_passes(rows, size=4, pad_id=0)
    shared_loss, shared_grads = loss_and_grads(model, shared)
    plain_loss, plain_grads = loss_and_grads(model, plain)
    assert shared_loss == pytest.approx(plain_loss, rel=1e-5)
    assert len(shared_grads) == len(plain_grads) > 0
    for a, b in zip(shared_grads, plain_grads, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
    # and row by row, the log-probs of the sampled tokens
    for unit in shared:
        for logprobs, batch in zip(pass_logprobs(model, unit), unit.batches, strict=True):
            whole = sampled_logprobs(model, batch)
            assert torch.allclose(logprobs * batch.loss_mask, whole * batch.loss_mask, atol=1e-5)


def test_the_shared_prefix_stops_at_a_difference_or_a_sampled_token() -> None:
    a = episode([1, 2, 3, 4], [([5, 6], [])], 1.0)
    b = episode([1, 2, 3, 4], [([5, 7], [])], -1.0)
    assert grpo_plan.shared_prefix([a, b]) == 4  # token 5 is sampled in both: not shared
    c = episode([1, 2, 9, 4], [([5], [])], 1.0)
    assert grpo_plan.shared_prefix([a, b, c]) == 2
    assert grpo_plan.shared_prefix([a]) == 0  # one row: nothing to share
    short = episode([1], [([2], [])], 1.0)
    assert grpo_plan.shared_prefix([a, short]) == 1


def test_passes_hold_at_most_size_rows_and_split_only_where_padding_costs_more() -> None:
    prompt = list(range(1, 101))
    near = [episode(prompt, [([7] * n, [])], 1.0) for n in (10, 12, 14)]
    far = [episode(prompt, [([7] * n, [])], -1.0) for n in (400, 410)]
    (unit,) = grpo_plan.prefix_passes([near + far], size=8, pad_id=0)
    assert unit.prefix == 100
    assert [len(b.input_ids) for b in unit.batches] == [3, 2]  # short rows are not padded to 510
    units = grpo_plan.prefix_passes([near + far], size=2, pad_id=0)
    assert [sum(len(b.input_ids) for b in u.batches) for u in units] == [2, 2, 1]
    assert units[-1].prefix == 0  # a pass of one row shares nothing


@pytest.mark.parametrize(
    "update", [{}, {"zero_stage": 3}, {"lora_rank": 4, "lora_alpha": 8}], ids=["z0", "z3", "lora"]
)
def test_the_engine_step_is_the_same_with_the_prompt_shared(
    tiny_dir: Path, update: dict[str, int], tmp_path: Path
) -> None:
    """Through DeepSpeed (ZeRO-3 gathers parameters per forward) and PEFT: one step with
    `share_prompt` gives the update of the step without it."""
    config = GRPOConfig(learning_rate=1e-3, micro_batch_size=3, max_staleness=8, **update)
    groups = on_policy_groups(tiny_dir)
    saved = {}
    for name, share in (("before", None), ("shared", True), ("whole", False)):
        engine = LearnerEngine("cpu")
        engine.load(tiny_dir, 0, config)
        if share is not None:
            metrics = engine.train_step(groups, config.model_copy(update={"share_prompt": share}))
            assert metrics.rows == 8 and metrics.grad_norm > 0
        engine.save(tmp_path / name, base_name="r/v0")  # gathered under ZeRO-3
        files = sorted((tmp_path / name).glob("*.safetensors"))
        saved[name] = {k: v for f in files for k, v in load_file(f).items()}
    before, shared, whole = saved["before"], saved["shared"], saved["whole"]
    moved = max(float((whole[k] - before[k]).abs().max()) for k in before)
    diff = max(float((shared[k] - whole[k]).abs().max()) for k in before)
    assert moved > 0.5 * config.learning_rate
    assert diff <= 5e-3 * config.learning_rate, (diff, moved)


def test_a_token_bound_splits_batches_but_never_a_row() -> None:
    prompt = list(range(1, 101))
    rows = [episode(prompt, [([7] * n, [])], 1.0) for n in (100, 100, 100, 300)]
    (unit,) = grpo_plan.prefix_passes([rows], size=8, pad_id=0, max_tokens=450)
    assert sorted(tuple(b.input_ids.shape) for b in unit.batches) == [(1, 200), (1, 400), (2, 200)]
    plain = list(grpo_plan.micro_batches(rows, size=8, pad_id=0, max_tokens=450))
    assert [tuple(b.input_ids.shape) for b in plain] == [(2, 200), (1, 200), (1, 400)]
    assert [len(b.input_ids) for b in grpo_plan.micro_batches(rows, size=3, pad_id=0)] == [3, 1]


def test_a_sliding_window_model_is_refused_once_not_retried(tiny_dir: Path, tmp_path: Path) -> None:
    """Its cache layers cannot hold a shared prompt: a ValueError (the activity's `invalid`, and
    expected on every rank), where a TypeError was retried as a fault without end."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    model = MistralForCausalLM(
        MistralConfig(
            vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, sliding_window=16, pad_token_id=0,
            eos_token_id=2, bos_token_id=1,
        )
    )  # fmt: skip
    model.save_pretrained(tmp_path)
    for path in tiny_dir.glob("*token*"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    config = GRPOConfig(max_staleness=8, share_prompt=True)
    engine = LearnerEngine("cpu")
    engine.load(tmp_path, 0, config)
    with pytest.raises(ValueError, match="set the learner's share_prompt to false"):
        engine.train_step(on_policy_groups(tmp_path), config)
