"""How a learner step is planned (`infra.grpo` holds the objective): which rows are computed, and
in which batches and passes.

    plan = plan_step(groups, step=5, config=cfg, pad_id=0)  # `Pass`es, a group's prompt once in
    for unit in plan.passes:                                # each (infra/learner_forward.py)
        ...

Rows are sorted by length and cut into micro-batches of at most `micro_batch_size` rows and
`micro_batch_tokens` padded tokens. Where `GRPOConfig.shares_prompt` says so, a group's rows
form passes that compute its prompt once; a pass is cut into shorter batches only where the
padding saved exceeds the cost of one more forward (`PASS_OVERHEAD_TOKENS`). Not covered:
packing several rows into one sequence (padding is what a batch costs here).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from contracts.learner import GRPOConfig
from contracts.trajectory import Trajectory
from infra.grpo import MicroBatch, Normalization, Row, collate, normalize, rows_from_group


def micro_batches(
    rows: Sequence[Row], size: int, pad_id: int, max_tokens: int = 0
) -> Iterator[MicroBatch]:
    """Rows sorted by length (less padding) in chunks of at most `size` rows and, when
    `max_tokens` > 0, at most that many padded tokens (a longer row goes alone)."""
    ordered = sorted(rows, key=lambda r: len(r.input_ids))
    start = 0
    while start < len(ordered):
        end = start + 1
        while end < len(ordered) and end - start < size:
            if max_tokens and (end + 1 - start) * len(ordered[end].input_ids) > max_tokens:
                break
            end += 1
        yield collate(ordered[start:end], pad_id)
        start = end


PASS_OVERHEAD_TOKENS = 64
"""What one more forward costs, counted in tokens (an estimate: kernel launches and Python for
every layer): `prefix_passes` splits a pass's rows into shorter batches only where the padding
saved exceeds it."""


@dataclass
class Pass:
    """One forward-backward of the learner: micro-batches whose rows all begin with the same
    `prefix` tokens, none of them in the loss (0: nothing shared). The prefix runs once, as one
    row, and every batch continues from its keys and values (`infra.learner_forward`)."""

    prefix: int
    batches: list[MicroBatch]

    def to(self, device: torch.device | str) -> Pass:
        return Pass(self.prefix, [batch.to(device) for batch in self.batches])


def shared_prefix(rows: Sequence[Row]) -> int:
    """Tokens every row begins with, stopping at the first sampled token of any row and one
    token short of the shortest row; 0 for a single row (nothing to share)."""
    if len(rows) < 2:
        return 0
    first = rows[0].input_ids
    limit = min(min(len(r.input_ids) - 1 for r in rows), min(r.loss_mask.index(1) for r in rows))
    for length in range(limit):
        if any(r.input_ids[length] != first[length] for r in rows):
            return length
    return limit


def _cheapest_cuts(lengths: Sequence[int], prefix: int, max_tokens: int) -> list[int]:
    """Cut points of ascending `lengths` (the tokens after a shared `prefix`) into consecutive
    batches that minimise padded tokens plus `PASS_OVERHEAD_TOKENS` per batch, each batch at
    most `max_tokens` padded tokens with its prefix columns (0: no bound; one row may exceed it).
    Exact, O(n²) over a pass's few rows."""
    cost = [0.0] + [math.inf] * len(lengths)
    cut_before = [0] * (len(lengths) + 1)
    for end in range(1, len(lengths) + 1):
        for start in range(end):
            width = (end - start) * (prefix + lengths[end - 1])
            if max_tokens and end - start > 1 and width > max_tokens:
                continue
            total = cost[start] + (end - start) * lengths[end - 1] + PASS_OVERHEAD_TOKENS
            if total < cost[end]:
                cost[end], cut_before[end] = total, start
    cuts, end = [], len(lengths)
    while end > 0:
        cuts.append(end)
        end = cut_before[end]
    return [0, *reversed(cuts)]


def prefix_passes(
    groups: Sequence[Sequence[Row]], size: int, pad_id: int, max_tokens: int = 0
) -> list[Pass]:
    """Each group's rows (one task's samples, one prompt) in passes of at most `size` rows
    sharing their prompt, each pass split by length into micro-batches where that pays (and
    where `max_tokens` demands it).

    A group's samples repeat its prompt token for token; the plain `micro_batches` compute it
    once per sample. Here it is computed once per pass: in the default run's groups the prompt
    is about 38% of the learner's tokens (spread-s2's 36 groups: 12,750 of 33,866)."""
    passes = []
    for group in groups:
        ordered = sorted(group, key=lambda r: len(r.input_ids))
        for start in range(0, len(ordered), size):
            rows = ordered[start : start + size]
            prefix = shared_prefix(rows)
            cuts = _cheapest_cuts([len(r.input_ids) - prefix for r in rows], prefix, max_tokens)
            batches = [collate(rows[a:b], pad_id) for a, b in zip(cuts, cuts[1:], strict=False)]
            passes.append(Pass(prefix, batches))
    return passes


def plain_passes(rows: Sequence[Row], size: int, pad_id: int, max_tokens: int = 0) -> list[Pass]:
    """`micro_batches` as passes that share nothing (every row computed whole)."""
    return [Pass(0, [batch]) for batch in micro_batches(rows, size, pad_id, max_tokens)]


@dataclass
class StepPlan:
    passes: list[Pass]
    rows: list[Row]  # the rows computed (those with a gradient), normalised with the step's
    used: list[str]  # trajectory ids trained on (not stale)
    dropped: list[str]  # trajectory ids dropped as stale


def plan_step(
    groups: Sequence[Sequence[Trajectory]],
    step: int,
    config: GRPOConfig,
    pad_id: int,
    normalization: Normalization = "tokens",
    device: str = "cpu",
    ranks: int = 1,
) -> StepPlan:
    """A learner step's rows, normalised over the whole step, in the passes `config` asks for
    on `device` and `ranks` ranks (`GRPOConfig.shares_prompt`). Without a KL term a flat group
    gives no gradient and is left out, and a row of zero advantage is counted in the
    normalisation (its group has a signal) but not computed."""
    counted: list[list[Row]] = []
    used: list[str] = []
    dropped: list[str] = []
    for group in groups:
        part = rows_from_group(group, step, config)
        if config.kl_coef > 0 or any(r.has_signal for r in part.rows):
            counted.append(part.rows)
        used += part.used
        dropped += part.dropped
    normalize([row for part in counted for row in part], normalization)
    by_group = [[r for r in part if config.kl_coef > 0 or r.has_signal] for part in counted]
    rows = [row for part in by_group for row in part]
    size, most = config.micro_batch_size, config.micro_batch_tokens
    if config.shares_prompt(device, ranks):
        passes = prefix_passes(by_group, size, pad_id, most)
    else:
        passes = plain_passes(rows, size, pad_id, most)
    return StepPlan(passes, rows, used, dropped)
