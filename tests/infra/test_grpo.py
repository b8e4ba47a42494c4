"""GRPO math on hand-computed cases: advantages, staleness, masking, clipping, KL, normalisation,
and multi-step rows: the trained ids are the trajectory's, masked tokens get no gradient."""

from __future__ import annotations

import math

import pytest
import torch

from contracts.learner import GRPOConfig, has_signal
from infra import grpo
from infra.credit import group_advantages
from tests.trajectories import Step, trajectory


def row(
    prompt: list[int], completion: list[int], old: list[float], advantage: float, **kw: float
) -> grpo.Row:
    """A one-step row: `prompt` masked out, `completion` sampled with log-probs `old`."""
    return grpo.Row(
        "a",
        [*prompt, *completion],
        [0] * len(prompt) + [1] * len(completion),
        [0.0] * len(prompt) + old,
        [0.0] * len(prompt) + [advantage] * len(completion),
        **kw,
    )


def test_group_advantages_hand_computed() -> None:
    # mean 0.25, unbiased std sqrt((0.75² + 3·0.25²)/3) = 0.5
    assert group_advantages([1, 0, 0, 0]) == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert group_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]
    assert group_advantages([1.0]) == [0.0]
    # one rule decides both: the run's dynamic sampling redraws exactly these groups
    for flat in ([0.3, 0.3, 0.3], [1.0], []):
        assert not has_signal(flat) and not any(group_advantages(flat))
    assert has_signal([0.0, 0.0, 1.0]) and any(group_advantages([0.0, 0.0, 1.0]))
    advantages = group_advantages([2.0, -1.0, 0.5, 0.5])
    assert sum(advantages) == pytest.approx(0.0, abs=1e-9)


def test_staleness_weight() -> None:
    # learner at step 5 accepting a lag of 2: versions 3..5 are fresh
    assert grpo.staleness_weight(3, 5, 2, "drop") == 1.0
    assert grpo.staleness_weight(2, 5, 2, "drop") == 0.0
    assert grpo.staleness_weight(2, 5, 2, "downweight") == 0.5
    assert grpo.staleness_weight(1, 5, 2, "downweight") == 0.25


def test_one_row_per_episode_and_stale_drop() -> None:
    # step 0: prompt [1, 5], sampled [7, 8]; step 1: observation [2, 9] added, sampled [6]
    fresh = trajectory(
        [Step([1, 5], [7, 8], [-0.1, -0.2], 4), Step([2, 9], [6], [-0.3], 5)], reward=1.0
    )
    stale = trajectory([Step([1, 5], [9], policy_version=1)], sample=1)  # 4 behind step 5
    others = [
        trajectory([Step([1], [3], policy_version=5)], sample=2),
        trajectory([Step([1], [4], policy_version=5)], sample=3),
    ]
    out = grpo.rows_from_group([fresh, stale, *others], step=5, config=GRPOConfig(max_staleness=2))
    assert out.dropped == ["r.t.s1"] and out.used == ["r.t.s0", "r.t.s2", "r.t.s3"]
    first = out.rows[0]
    # the episode is one row: its ids exactly as sampled, the mask on the sampled tokens only,
    # the advantage from all four rewards (the dropped one's included)
    assert first.input_ids == fresh.token_ids == [1, 5, 7, 8, 2, 9, 6]
    assert first.loss_mask == [0, 0, 1, 1, 0, 0, 1] and first.sampled == 3
    assert first.old_logprobs == [0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3]
    assert first.advantages == pytest.approx([0, 0, 1.5, 1.5, 0, 0, 1.5], abs=1e-5)
    # a multi-step trajectory is as stale as its oldest step
    mixed = trajectory([Step([1], [2], policy_version=2), Step([3], [2], policy_version=5)])
    assert grpo.rows_from_group([mixed], step=5, config=GRPOConfig(max_staleness=2)).dropped


def test_an_episode_with_nothing_sampled_gives_no_row_and_is_never_stale() -> None:
    """Ended by the context budget before its first step, it has no policy version (0): at a
    step past `max_staleness` it was once counted as dropped for staleness."""
    ended_at_once = trajectory([])
    for step in (0, 9):
        out = grpo.rows_from_group([ended_at_once], step=step, config=GRPOConfig(max_staleness=2))
        assert out.rows == [] and out.used == ["r.t.s0"] and out.dropped == []


def test_collate_masks_prompt_observation_and_padding() -> None:
    rows = [
        grpo.Row(
            "a",
            [1, 2, 3, 4, 5, 6],
            [0, 0, 1, 0, 0, 1],
            [0, 0, -0.1, 0, 0, -0.2],
            [0, 0, 1, 0, 0, 2],
        ),
        grpo.Row("b", [1, 5], [0, 1], [0.0, -0.3], [0, -1]),
    ]
    grpo.normalize(rows, "tokens")
    batch = grpo.collate(rows, pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 6], [1, 5, 0, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1] * 6, [1, 1, 0, 0, 0, 0]]
    # position j predicts token j+1: row a's sampled tokens 3 and 6 are predicted at 1 and 4
    assert batch.loss_mask.tolist() == [[0, 1, 0, 0, 1], [1, 0, 0, 0, 0]]
    expected_old = torch.tensor([[0, -0.1, 0, 0, -0.2], [-0.3, 0, 0, 0, 0]])
    assert torch.allclose(batch.old_logprobs, expected_old)
    assert torch.allclose(batch.token_scale, batch.loss_mask / 3)
    # each predicted token carries its own advantage (a turn's, under credit "turn")
    assert batch.advantages.tolist() == [[0, 1, 0, 0, 2], [-1, 0, 0, 0, 0]]


def test_masked_tokens_get_zero_gradient() -> None:
    """Observation and template tokens inside an episode are in the forward pass, not the loss."""
    episode = trajectory([Step([1, 2], [3, 4]), Step([5, 6, 7], [8])], reward=1.0)
    group = [episode, trajectory([Step([1, 2], [9])], sample=1)]
    (first, _) = grpo.rows_from_group(group, step=0, config=GRPOConfig()).rows
    grpo.normalize([first])
    batch = grpo.collate([first], pad_id=0)
    logprobs = torch.full(batch.loss_mask.shape, -1.0, requires_grad=True)  # ratio 1
    loss, stats = grpo.grpo_loss(logprobs, batch, clip_eps=0.2)
    loss.backward()
    assert logprobs.grad is not None
    gradient = logprobs.grad[0].tolist()
    predicted = batch.input_ids[0, 1:].tolist()  # the token each position predicts
    for token, grad in zip(predicted, gradient, strict=True):
        sampled = token in (3, 4, 8)
        assert (grad != 0.0) == sampled, (token, grad)
    assert stats["tokens"] == 3


def test_normalization_modes() -> None:
    short = row([1], [2], [0.0], 1.0)
    long = row([1], [2, 3, 4], [0.0] * 3, 1.0)
    grpo.normalize([short, long], "tokens")
    assert (short.scale, long.scale) == (0.25, 0.25)
    grpo.normalize([short, long], "sequence")
    assert (short.scale, long.scale) == (0.5, pytest.approx(1 / 6))
    long.weight = 0.5  # down-weighted for staleness
    grpo.normalize([short, long], "tokens")
    assert long.scale == 0.125


def one_row_batch(advantage: float, old: list[float]) -> grpo.MicroBatch:
    one = row([1], [2, 3, 4], old, advantage)
    grpo.normalize([one])
    return grpo.collate([one], pad_id=0)


def test_clipped_loss_hand_computed() -> None:
    old = [-1.0, -1.0, -1.0]
    ratios = torch.tensor([[1.5, 0.5, 1.0]])
    logprobs = (torch.log(ratios) - 1.0).requires_grad_()
    # A = +1: per-token max(-r, -clip(r)) = [-1.2, -0.5, -1.0] → mean -0.9
    loss, stats = grpo.grpo_loss(logprobs, one_row_batch(1.0, old), clip_eps=0.2)
    assert loss.item() == pytest.approx(-0.9, abs=1e-6)
    assert stats["clipped"] == 1 and stats["tokens"] == 3
    loss.backward()
    assert logprobs.grad is not None
    # the clipped token gets no gradient; the others get -A·r/3
    assert logprobs.grad.tolist()[0] == pytest.approx([0.0, -0.5 / 3, -1.0 / 3])
    # A = -1: [max(1.5, 1.2), max(0.5, 0.8), 1.0] → mean 1.1, the low ratio is clipped
    loss, stats = grpo.grpo_loss(logprobs.detach(), one_row_batch(-1.0, old), clip_eps=0.2)
    assert loss.item() == pytest.approx(1.1, abs=1e-6)
    assert stats["clipped"] == 1


def test_kl_penalty_k3() -> None:
    old = [-1.0, -1.0, -1.0]
    logprobs = torch.full((1, 3), -1.0)  # ratio 1 everywhere
    reference = logprobs + math.log(2.0)  # k3 = 2 - ln 2 - 1 per token
    batch = one_row_batch(0.0, old)
    loss, stats = grpo.grpo_loss(logprobs, batch, clip_eps=0.2, ref_logprobs=reference, kl_coef=0.1)
    k3 = 2 - math.log(2.0) - 1
    assert loss.item() == pytest.approx(0.1 * k3, abs=1e-6)
    assert stats["kl_ref"] == pytest.approx(3 * k3, abs=1e-5)
    no_kl, _ = grpo.grpo_loss(logprobs, batch, clip_eps=0.2, ref_logprobs=reference, kl_coef=0.0)
    assert no_kl.item() == 0.0


def test_loss_ignores_prompt_and_padding_positions() -> None:
    batch = one_row_batch(1.0, [-1.0, -1.0, -1.0])
    two = grpo.collate(
        [
            row([1, 2], [3, 4], [-1.0, -1.0], 1.0, scale=0.5),
            row([1], [2], [-1.0], 1.0, scale=0.5),
        ],
        pad_id=0,
    )
    logprobs = torch.full((2, 3), -1.0)
    base, _ = grpo.grpo_loss(logprobs, two, clip_eps=0.2)
    logprobs[0, 0] = 5.0  # a prompt position (predicts token 2, a prompt token)
    logprobs[1, 1:] = -50.0  # padding positions
    assert grpo.grpo_loss(logprobs, two, clip_eps=0.2)[0].item() == base.item()
    assert batch.tokens == 3


def test_token_logprobs_match_log_softmax() -> None:
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    ids = torch.randint(0, 11, (2, 5))
    expected = torch.log_softmax(logits, -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    assert torch.allclose(grpo.token_logprobs(logits, ids), expected, atol=1e-6)


def test_log_probs_are_taken_at_each_rows_sampling_temperature() -> None:
    """A trajectory sampled at T is recomputed at T (log_softmax(logits / T)), row by row, in
    the full and the sampled-positions forms: the ratio is then 1 on the policy that sampled."""
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11)
    ids = torch.randint(0, 11, (2, 5))
    temperature = torch.tensor([0.7, 1.0])
    scaled = torch.log_softmax(logits / temperature[:, None, None], -1)
    expected = scaled[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
    assert torch.allclose(grpo.token_logprobs(logits, ids, temperature), expected, atol=1e-6)
    positions = torch.tensor([1, 3])
    kept = grpo.token_logprobs_at(logits[:, positions], ids, positions, temperature)
    assert torch.allclose(kept[:, positions], expected[:, positions], atol=1e-6)
    assert not torch.allclose(grpo.token_logprobs(logits, ids)[0], expected[0], atol=1e-3)

    sampled = trajectory([Step([1, 5], [7, 8])], reward=1.0)
    sampled.logprob_temperature = 0.7
    rows = grpo.rows_from_group(
        [sampled, trajectory([Step([1, 5], [9])], sample=1)], 0, GRPOConfig()
    )
    batch = grpo.collate(rows.rows, pad_id=0)
    assert batch.temperature.tolist() == pytest.approx([0.7, 1.0])


def test_logprobs_at_sampled_positions_give_the_full_loss_and_gradient() -> None:
    """The learner computes logits only where a row predicts a sampled token
    (`sampled_positions`); the loss, its statistics and its gradient are the full ones."""
    batch = grpo.collate(
        [
            row([1, 2, 3], [4, 5], [-1.0, -2.0], 1.0, scale=0.5),
            row([1, 2], [3, 4, 5], [-1.5, -1.0, -0.5], -1.0, scale=0.25),
        ],
        pad_id=0,
    )
    torch.manual_seed(0)
    full_logits = torch.randn(2, batch.input_ids.size(1), 11, requires_grad=True)
    positions = grpo.sampled_positions(batch)
    assert positions.tolist() == [1, 2, 3]  # position 0 predicts a prompt token in both rows
    kept_logits = full_logits[:, positions]
    full = grpo.token_logprobs(full_logits, batch.input_ids)
    kept = grpo.token_logprobs_at(kept_logits, batch.input_ids, positions)
    assert torch.allclose(full * batch.loss_mask, kept * batch.loss_mask, atol=1e-6)
    full_loss, full_stats = grpo.grpo_loss(full, batch, clip_eps=0.2)
    kept_loss, kept_stats = grpo.grpo_loss(kept, batch, clip_eps=0.2)
    assert kept_loss.item() == pytest.approx(full_loss.item(), abs=1e-6)
    assert kept_stats == pytest.approx(full_stats, abs=1e-5)
    (full_grad,) = torch.autograd.grad(full_loss, full_logits)
    (kept_grad,) = torch.autograd.grad(kept_loss, full_logits)
    assert torch.allclose(full_grad, kept_grad, atol=1e-7)
