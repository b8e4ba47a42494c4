"""GRPO math on hand-computed cases: advantages, staleness, masking, clipping, KL, normalisation."""

from __future__ import annotations

import math

import pytest
import torch

from contracts.learner import GRPOConfig
from contracts.sandbox import ExecStatus
from contracts.trajectory import Trajectory, TrajectoryTurn
from infra import grpo


def turn(prompt: list[int], completion: list[int], version: int = 0, k: int = 0) -> TrajectoryTurn:
    return TrajectoryTurn(
        turn=k,
        policy_version=version,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=[-1.0] * len(completion),
        completion_text="",
        code="",
        status=ExecStatus.FAILED,
        reward=0.0,
    )


def trajectory(sample: int, reward: float, turns: list[TrajectoryTurn]) -> Trajectory:
    return Trajectory(
        id=f"r.t.s{sample}",
        run_id="r",
        task_id="t",
        sample=sample,
        group_size=4,
        prompt="p",
        turns=turns,
        reward=reward,
        solved=reward > 0,
        policy_version=turns[-1].policy_version,
        created_at="",
    )


def test_group_advantages_hand_computed() -> None:
    # mean 0.25, unbiased std sqrt((0.75² + 3·0.25²)/3) = 0.5
    assert grpo.group_advantages([1, 0, 0, 0]) == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert grpo.group_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]
    assert grpo.group_advantages([1.0]) == [0.0]
    advantages = grpo.group_advantages([2.0, -1.0, 0.5, 0.5])
    assert sum(advantages) == pytest.approx(0.0, abs=1e-9)


def test_staleness_weight() -> None:
    # learner at step 5 accepting a lag of 2: versions 3..5 are fresh
    assert grpo.staleness_weight(3, 5, 2, "drop") == 1.0
    assert grpo.staleness_weight(2, 5, 2, "drop") == 0.0
    assert grpo.staleness_weight(2, 5, 2, "downweight") == 0.5
    assert grpo.staleness_weight(1, 5, 2, "downweight") == 0.25


def test_rows_multi_turn_and_stale_drop() -> None:
    fresh = trajectory(0, 1.0, [turn([1, 5], [7, 8], 4, 0), turn([1, 5, 7, 8, 9], [6], 5, 1)])
    stale = trajectory(1, 0.0, [turn([1, 5], [9], 1)])  # 4 versions behind step 5
    others = [trajectory(2, 0.0, [turn([1], [3], 5)]), trajectory(3, 0.0, [turn([1], [4], 5)])]
    out = grpo.rows_from_group([fresh, stale, *others], step=5, config=GRPOConfig(max_staleness=2))
    assert out.dropped == ["r.t.s1"] and out.used == ["r.t.s0", "r.t.s2", "r.t.s3"]
    first, second = out.rows[:2]
    # each turn is its own row, prompt tokens exactly as recorded, same advantage (baseline
    # computed over all four rewards, the dropped one included)
    assert first.input_ids == [1, 5, 7, 8] and first.prompt_len == 2
    assert second.input_ids == [1, 5, 7, 8, 9, 6] and second.prompt_len == 5
    assert first.advantage == second.advantage == pytest.approx(1.5, abs=1e-5)
    # a multi-turn trajectory is as stale as its oldest turn
    mixed = trajectory(0, 1.0, [turn([1], [2], 2, 0), turn([1], [2], 5, 1)])
    assert grpo.rows_from_group([mixed], step=5, config=GRPOConfig(max_staleness=2)).dropped


def test_rows_reject_mismatched_logprobs() -> None:
    bad = turn([1, 2], [3, 4])
    bad.completion_logprobs = [-1.0]
    with pytest.raises(ValueError, match="completion_logprobs"):
        grpo.rows_from_group([trajectory(0, 1.0, [bad])], step=0, config=GRPOConfig())


def test_collate_masks_prompt_and_padding() -> None:
    rows = [
        grpo.Row("a", [1, 2, 3, 4], prompt_len=2, old_logprobs=[-0.1, -0.2], advantage=1.0),
        grpo.Row("b", [1, 5], prompt_len=1, old_logprobs=[-0.3], advantage=-1.0),
    ]
    grpo.normalize(rows, "tokens")
    batch = grpo.collate(rows, pad_id=0)
    assert batch.input_ids.tolist() == [[1, 2, 3, 4], [1, 5, 0, 0]]
    assert batch.attention_mask.tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]
    # position j predicts token j+1: row a's completion tokens 3, 4 are predicted at 1, 2
    assert batch.loss_mask.tolist() == [[0, 1, 1], [1, 0, 0]]
    assert torch.allclose(batch.old_logprobs, torch.tensor([[0, -0.1, -0.2], [-0.3, 0, 0]]))
    assert torch.allclose(batch.token_scale, torch.tensor([[0, 1, 1], [1, 0, 0]]) / 3)


def test_normalization_modes() -> None:
    short = grpo.Row("a", [1, 2], prompt_len=1, old_logprobs=[0.0], advantage=1.0)
    long = grpo.Row("b", [1, 2, 3, 4], prompt_len=1, old_logprobs=[0.0] * 3, advantage=1.0)
    grpo.normalize([short, long], "tokens")
    assert (short.scale, long.scale) == (0.25, 0.25)
    grpo.normalize([short, long], "sequence")
    assert (short.scale, long.scale) == (0.5, pytest.approx(1 / 6))
    long.weight = 0.5  # down-weighted for staleness
    grpo.normalize([short, long], "tokens")
    assert long.scale == 0.125


def one_row_batch(advantage: float, old: list[float]) -> grpo.MicroBatch:
    row = grpo.Row("a", [1, 2, 3, 4], prompt_len=1, old_logprobs=old, advantage=advantage)
    grpo.normalize([row])
    return grpo.collate([row], pad_id=0)


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
            grpo.Row("a", [1, 2, 3, 4], 2, [-1.0, -1.0], 1.0, scale=0.5),
            grpo.Row("b", [1, 2], 1, [-1.0], 1.0, scale=0.5),
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
