"""The GRPO objective in plain torch: advantages, staleness, the clipped token loss.

    rows = rows_from_group(trajectories, step=5, config=cfg)         # one row per episode
    normalize(rows.rows)
    micro = collate(rows.rows, pad_id=0)                             # (infra/grpo_plan.py batches)
    logprobs = token_logprobs(model(micro.input_ids, ...).logits, micro.input_ids)
    loss, stats = grpo_loss(logprobs, micro, clip_eps=cfg.clip_eps)
    loss.backward()                                                  # sums to the step's loss

Choices, stated once:
- Advantages: the group's own baseline, (r_i - mean(r)) / (std(r) + eps), per episode or per
  turn (`GRPOConfig.credit`; the rules and their reasons are infra/credit.py's); exactly 0 when
  the group is flat (its rewards, or a turn's returns, equal up to round-off: `credit.flat`) or
  has one sample, so a row's `has_signal` and the plan's flat groups follow that one rule.
- Every episode is one training row: its trajectory's `token_ids` (exactly what the model saw
  and sampled over all its steps, never re-tokenized) with its `loss_mask`: only the tokens the
  policy sampled (mask 1) are in the loss, each weighted by its advantage (its episode's, or
  its turn's); prompt, observation and template tokens (mask 0) get no gradient.
- Log-probs are taken at the temperature the episode was sampled at (the trajectory's
  `logprob_temperature`: log_softmax(logits / T), top-p left out, as verl and TRL take them),
  by the sampler and here alike: at T = 1 the gradient would be that of another distribution
  than the one that drew the tokens, and a group's baseline would no longer cancel in it.
- Ratio: exp(logp_now - logp_sampled), against the log-probs recorded at sampling time (the
  trajectory's `logprobs`), PPO-clipped to [1 - eps, 1 + eps].
- KL to the reference (when kl_coef > 0): the k3 estimator exp(ref - logp) - (ref - logp) - 1.
- Normalisation "tokens" (default, as in DAPO): the step's loss is the sum of per-token losses
  over all sampled tokens of the step's rows divided by their count, so a long episode is not
  worth less per token than a short one. "sequence" (original GRPO): mean within each row, then
  mean over rows. The rows counted are those of the groups that carry a signal: without a KL
  term a flat group (every advantage 0) gives no gradient and is left out, of the count too, as
  DAPO's dynamic sampling leaves flat groups out, so the update per token does not shrink as
  more groups come back flat (with kl_coef > 0 every row counts). A row of zero advantage in a
  group with a signal (its reward the group's mean) is counted but not computed: its gradient
  is 0. Either way each row carries a precomputed per-token `scale`, so micro-batch losses
  simply add up to the step's loss (gradient accumulation needs no further scaling).
- Staleness: a trajectory whose oldest step is more than `max_staleness` versions behind the
  learner is dropped ("drop") or weighted 0.5 ** (extra lag) ("downweight").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from contracts.learner import GRPOConfig
from contracts.trajectory import Trajectory
from infra.credit import token_advantages

Normalization = Literal["tokens", "sequence"]
MAX_LOG_RATIO = 20.0
"""Log-ratios are clamped to ±this before exp, so a wild mismatch cannot overflow to inf."""


def staleness_weight(
    policy_version: int, step: int, max_staleness: int, mode: Literal["drop", "downweight"]
) -> float:
    """Weight of a trajectory sampled from `policy_version` when the learner holds `step`."""
    excess = (step - policy_version) - max_staleness
    if excess <= 0:
        return 1.0
    return 0.0 if mode == "drop" else 0.5**excess


@dataclass
class Row:
    """One episode (trajectory), ready to batch; the three lists are aligned token by token."""

    trajectory_id: str
    input_ids: list[int]  # the episode's token sequence
    loss_mask: list[int]  # 1 where the policy sampled the token, 0 elsewhere
    old_logprobs: list[float]  # the sampled log-prob where the mask is 1, else 0
    advantages: list[float]  # the token's advantage where the mask is 1, else 0
    weight: float = 1.0  # staleness weight
    scale: float = 0.0  # per-token loss scale, set by normalize()
    temperature: float = 1.0  # the log-probs' temperature (the trajectory's logprob_temperature)

    @property
    def sampled(self) -> int:
        """Tokens in the loss."""
        return sum(self.loss_mask)

    @property
    def has_signal(self) -> bool:
        """Whether any of its tokens has an advantage (without a KL term, else no gradient); a
        flat group's are exactly 0 (`credit.flat`)."""
        return any(self.advantages)


@dataclass
class GroupRows:
    rows: list[Row]
    used: list[str]  # trajectory ids trained on (weight > 0)
    dropped: list[str]  # trajectory ids dropped as stale


def rows_from_group(trajectories: Sequence[Trajectory], step: int, config: GRPOConfig) -> GroupRows:
    """Rows of one GRPO group. The baseline uses every sample's reward, stale ones included."""
    advantages = token_advantages(trajectories, config.credit, config.turn_discount)
    out = GroupRows(rows=[], used=[], dropped=[])
    for trajectory, per_token in zip(trajectories, advantages, strict=True):
        if not any(trajectory.loss_mask):  # nothing sampled (the context budget ended it before
            out.used.append(trajectory.id)  # its first step): no policy to be stale, no row
            continue
        oldest = min(trajectory.oldest_policy_version, trajectory.policy_version)
        weight = staleness_weight(oldest, step, config.max_staleness, config.stale_policy)
        if weight == 0.0:
            out.dropped.append(trajectory.id)
            continue
        out.used.append(trajectory.id)
        if trajectory.loss_mask[:1] == [1]:
            raise ValueError(f"trajectory {trajectory.id}: its first token is marked as sampled")
        out.rows.append(
            Row(
                trajectory_id=trajectory.id,
                input_ids=list(trajectory.token_ids),
                loss_mask=list(trajectory.loss_mask),
                old_logprobs=list(trajectory.logprobs),
                advantages=per_token,
                weight=weight,
                temperature=trajectory.logprob_temperature,
            )
        )
    return out


def normalize(rows: Sequence[Row], mode: Normalization = "tokens") -> None:
    """Set each row's per-token `scale` so that the step's loss is the chosen mean."""
    total_tokens = sum(r.sampled for r in rows)
    for row in rows:
        if mode == "tokens":
            row.scale = row.weight / total_tokens
        else:
            row.scale = row.weight / (row.sampled * len(rows))


@dataclass
class MicroBatch:
    """Right-padded tensors; every (B, T-1) tensor is aligned with the *predicted* tokens."""

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long
    loss_mask: torch.Tensor  # (B, T-1) float: 1 where the predicted token was sampled
    old_logprobs: torch.Tensor  # (B, T-1) float
    advantages: torch.Tensor  # (B, T-1) float: the predicted token's advantage
    token_scale: torch.Tensor  # (B, T-1) float: loss_mask * row.scale
    temperature: torch.Tensor  # (B,) float: each row's log-prob temperature

    def to(self, device: torch.device | str) -> MicroBatch:
        return MicroBatch(**{k: v.to(device) for k, v in vars(self).items()})

    @property
    def tokens(self) -> int:
        return int(self.loss_mask.sum().item())


def collate(rows: Sequence[Row], pad_id: int) -> MicroBatch:
    width = max(len(r.input_ids) for r in rows)
    batch = len(rows)
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    attention = torch.zeros((batch, width), dtype=torch.long)
    loss_mask = torch.zeros((batch, width - 1))
    old = torch.zeros((batch, width - 1))
    advantages = torch.zeros((batch, width - 1))
    for i, row in enumerate(rows):
        n = len(row.input_ids)
        input_ids[i, :n] = torch.tensor(row.input_ids)
        attention[i, :n] = 1
        # target position j predicts input_ids[j + 1]: its mask and old log-prob are token j+1's
        loss_mask[i, : n - 1] = torch.tensor(row.loss_mask[1:], dtype=torch.float)
        old[i, : n - 1] = torch.tensor(row.old_logprobs[1:]) * loss_mask[i, : n - 1]
        advantages[i, : n - 1] = torch.tensor(row.advantages[1:])  # 0 off the mask (credit.py)
    scales = torch.tensor([r.scale for r in rows])[:, None]
    return MicroBatch(
        input_ids=input_ids,
        attention_mask=attention,
        loss_mask=loss_mask,
        old_logprobs=old,
        advantages=advantages,
        token_scale=loss_mask * scales,
        temperature=torch.tensor([r.temperature for r in rows]),
    )


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, temperature: torch.Tensor | None = None
) -> torch.Tensor:
    """log p(input_ids[:, j+1] | prefix) for j < T-1, in float32: shape (B, T-1), each row's
    at its `temperature` (B,) (none: 1)."""
    return _logprobs_of(logits[:, :-1], input_ids[:, 1:], temperature)


def _logprobs_of(
    logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor | None
) -> torch.Tensor:
    """log p(targets) under `logits` (B, K, V) / `temperature` (B,), in float32: (B, K)."""
    scaled = logits.float()
    if temperature is not None and bool((temperature != 1.0).any()):
        scaled = scaled / temperature.to(scaled.device, torch.float32)[:, None, None]
    flat = torch.nn.functional.cross_entropy(
        scaled.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="none"
    )
    return -flat.view_as(targets)


def sampled_positions(batch: MicroBatch) -> torch.Tensor:
    """Positions j (of T-1) where some row of the batch predicts a sampled token: the only ones
    whose log-probs the loss reads."""
    return batch.loss_mask.any(dim=0).nonzero()[:, 0]


def token_logprobs_at(
    logits: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    temperature: torch.Tensor | None = None,
) -> torch.Tensor:
    """`token_logprobs` from the logits at `positions` only (`logits`: (B, len(positions), V),
    as `logits_to_keep=positions` returns them): shape (B, T-1), zero at the other positions.
    The LM head and the log-softmax then cost the sampled tokens' share of the sequence."""
    kept = _logprobs_of(logits, input_ids[:, positions + 1], temperature)
    out = kept.new_zeros((input_ids.size(0), input_ids.size(1) - 1))
    return out.index_copy(1, positions, kept)


def grpo_loss(
    logprobs: torch.Tensor,
    batch: MicroBatch,
    *,
    clip_eps: float,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's share of the step loss, and token sums for the step's statistics.

    Returned stats are sums over sampled tokens (divide by `tokens` for means): `clipped`
    (tokens whose clipped branch is active), `ratio`, `kl_sampler` (k3 to the sampling policy),
    `kl_ref` (k3 to the reference, when given).
    """
    mask = batch.loss_mask
    log_ratio = (logprobs - batch.old_logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO) * mask
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    unclipped_loss = -batch.advantages * ratio
    clipped_loss = -batch.advantages * clipped_ratio
    token_loss = torch.maximum(unclipped_loss, clipped_loss)
    stats = {
        "tokens": float(mask.sum()),
        "clipped": float(((clipped_loss > unclipped_loss).float() * mask).sum()),
        "ratio": float((ratio.detach() * mask).sum()),
        "kl_sampler": float((_k3(logprobs.detach(), batch.old_logprobs) * mask).sum()),
    }
    if ref_logprobs is not None:
        kl = _k3(logprobs, ref_logprobs) * mask
        stats["kl_ref"] = float(kl.detach().sum())
        if kl_coef > 0:
            token_loss = token_loss + kl_coef * kl
    loss = (token_loss * batch.token_scale).sum()
    return loss, stats


def _k3(logprobs: torch.Tensor, other_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(π || other) per token: exp(o - l) - (o - l) - 1 (≥ 0, unbiased)."""
    delta = (other_logprobs - logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return torch.exp(delta) - delta - 1.0


def finite(value: float) -> float:
    """`value`, or 0.0 when it is NaN/inf (for metrics that must serialize)."""
    return value if math.isfinite(value) else 0.0
