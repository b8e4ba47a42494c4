"""How a learner step is planned (`infra.grpo_plan`): which rows train, where batches are cut, and
that the loss's statistics count sampled tokens only. Hand-sized cases at the bounds, where an
off-by-one would change the plan; the loss itself is tests/infra/test_grpo.py's."""

from __future__ import annotations

import math

import pytest
import torch

from contracts.learner import GRPOConfig
from infra import grpo, grpo_plan
from tests.infra.test_grpo import row
from tests.trajectories import Step, trajectory


def rows_of(*lengths: int, prompt: int = 1) -> list[grpo.Row]:
    """One group's rows: the same `prompt` tokens, then `length - prompt` sampled tokens each."""
    shared = list(range(1, prompt + 1))
    return [row(shared, [50 + n] * (n - prompt), [0.0] * (n - prompt), 1.0) for n in lengths]


def row_counts(batches: list[grpo.MicroBatch]) -> list[int]:
    return [len(b.input_ids) for b in batches]


def test_micro_batches_fill_up_to_the_row_and_token_bounds_exactly() -> None:
    rows = rows_of(4, 4, 4, 4, 4)

    def counts(size: int, max_tokens: int = 0) -> list[int]:
        return row_counts(
            list(grpo_plan.micro_batches(rows, size, pad_id=0, max_tokens=max_tokens))
        )

    assert counts(2, max_tokens=8) == [2, 2, 1]
    assert counts(2, max_tokens=7) == [1] * 5
    assert counts(3, max_tokens=12) == [3, 2]
    assert counts(3) == [3, 2]


def test_a_row_longer_than_the_token_bound_goes_alone() -> None:
    batches = list(grpo_plan.micro_batches(rows_of(3, 5, 50), size=4, pad_id=0, max_tokens=20))
    assert [tuple(b.input_ids.shape) for b in batches] == [(2, 5), (1, 50)]


def test_a_pass_is_cut_after_its_first_row_when_that_saves_more_than_a_forward() -> None:
    # after the 3 shared prompt tokens: 1 and 100 tokens. One batch pads the short row to 100
    # (2·100 + 64 = 264); two batches cost 1 + 64 + 100 + 64 = 229.
    (unit,) = grpo_plan.prefix_passes([rows_of(4, 103, prompt=3)], size=8, pad_id=0)
    assert unit.prefix == 3 and row_counts(unit.batches) == [1, 1]
    # close lengths: one batch (2·5 + 64 = 74 against 138)
    (unit,) = grpo_plan.prefix_passes([rows_of(8, 8, prompt=3)], size=8, pad_id=0)
    assert row_counts(unit.batches) == [2]


def test_the_token_bound_of_a_pass_counts_its_prefix_and_holds_at_its_value() -> None:
    group = rows_of(8, 8, prompt=3)  # a batch of both: 2 rows × (3 + 5) = 16 tokens
    (unit,) = grpo_plan.prefix_passes([group], size=8, pad_id=0, max_tokens=16)
    assert row_counts(unit.batches) == [2]
    (unit,) = grpo_plan.prefix_passes([group], size=8, pad_id=0, max_tokens=15)
    assert row_counts(unit.batches) == [1, 1]
    # a row over the bound on its own still trains, alone
    (unit,) = grpo_plan.prefix_passes([rows_of(8, 53, prompt=3)], size=8, pad_id=0, max_tokens=16)
    assert row_counts(unit.batches) == [1, 1]


def group(rewards: list[float]) -> list:
    return [
        trajectory([Step([1, 2], [3, 4 + i])], reward=r, sample=i) for i, r in enumerate(rewards)
    ]


def test_rows_without_advantage_are_left_out_unless_a_kl_term_trains_them() -> None:
    flat, signal = group([1.0, 1.0]), group([1.0, 0.0])
    plain = grpo_plan.plan_step([flat, signal], step=0, config=GRPOConfig(), pad_id=0)
    assert len(plain.rows) == 2 and len(plain.used) == 4  # the flat group is used, not trained
    with_kl = grpo_plan.plan_step([flat, signal], step=0, config=GRPOConfig(kl_coef=0.1), pad_id=0)
    assert len(with_kl.rows) == 4


def test_a_row_at_its_groups_mean_counts_in_the_step_as_dapo_counts_it() -> None:
    """DAPO's token mean counts every token of the groups it keeps: a sample whose reward is its
    group's mean (advantage 0) is not computed but still counted, so the update per token does
    not jump by half when a reward moves from 0.5 + 1e-9 to 0.5."""
    scales = []
    for middle in (0.5, 0.5 + 1e-9):
        plan = grpo_plan.plan_step(
            [group([0.0, middle, 1.0])], step=0, config=GRPOConfig(), pad_id=0
        )
        scales.append(sorted(r.scale for r in plan.rows))
        assert len(plan.used) == 3
    assert len(scales[0]) == 2 and len(scales[1]) == 3  # the mean's row is not computed ...
    assert scales[0][0] == pytest.approx(scales[1][0])  # ... but counted: 1/6 per token both


def test_a_trajectory_whose_first_token_is_marked_sampled_is_refused() -> None:
    bad = trajectory([Step([], [3, 4])], reward=1.0)
    with pytest.raises(ValueError, match="first token is marked as sampled"):
        grpo.rows_from_group([bad, *group([0.0])], step=0, config=GRPOConfig())


def test_the_statistics_sum_over_sampled_tokens_only() -> None:
    rows = rows_of(3, 5, prompt=2)  # 1 and 3 sampled tokens; the first row padded by 2
    grpo.normalize(rows)
    batch = grpo.collate(rows, pad_id=0)
    logprobs = torch.full(batch.loss_mask.shape, -3.0)  # masked positions: anything
    logprobs[batch.loss_mask.bool()] = 0.0  # = the sampled log-probs: ratio 1
    _, stats = grpo.grpo_loss(logprobs, batch, clip_eps=0.2, ref_logprobs=logprobs.clone())
    assert stats["tokens"] == 4
    assert stats["ratio"] == pytest.approx(4.0)
    assert stats["kl_sampler"] == pytest.approx(0.0) and stats["kl_ref"] == pytest.approx(0.0)
    assert stats["clipped"] == 0


def test_finite_turns_what_cannot_be_serialized_into_zero() -> None:
    assert grpo.finite(1.5) == 1.5
    assert grpo.finite(math.nan) == 0.0 and grpo.finite(-math.inf) == 0.0


def test_a_groups_prompt_is_shared_on_a_cpu_and_not_on_a_gpu_unless_the_config_says() -> None:
    """`share_prompt` unset: one pass per group with its prompt as prefix on a CPU, every row
    whole on a GPU (bench/learner.py measured each faster where it is chosen); set, it holds."""
    groups = [
        [
            trajectory([Step([1, 2, 3], [7 + s, 8], [-0.5, -0.5])], reward=float(s), sample=s)
            for s in range(2)
        ]
    ]

    def prefixes(config: GRPOConfig, device: str) -> list[int]:
        return [p.prefix for p in grpo_plan.plan_step(groups, 0, config, 0, device=device).passes]

    assert prefixes(GRPOConfig(), "cpu") == [3]
    assert prefixes(GRPOConfig(), "cuda") == prefixes(GRPOConfig(), "cuda:1") == [0]
    assert prefixes(GRPOConfig(share_prompt=True), "cuda") == [3]
    assert prefixes(GRPOConfig(share_prompt=False), "cpu") == [0]


def test_zero3_on_several_ranks_never_shares_a_prompt() -> None:
    """A shared pass makes one forward per batch of its group, which differ between ranks, and
    ZeRO-3 gathers the weights in each: the ranks' collectives would no longer pair up (a hang
    until the collective timeout, every retry alike). One rank, or ZeRO 0–2, may share."""
    zero3 = GRPOConfig(zero_stage=3)
    assert not zero3.shares_prompt("cpu", ranks=2)
    assert zero3.shares_prompt("cpu", ranks=1) and GRPOConfig(zero_stage=2).shares_prompt("cpu", 2)
    with pytest.raises(ValueError, match="share_prompt with ZeRO-3 on 2 ranks"):
        GRPOConfig(zero_stage=3, share_prompt=True).shares_prompt("cpu", ranks=2)
