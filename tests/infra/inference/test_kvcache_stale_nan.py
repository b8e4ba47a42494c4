"""A slot that a row computing NaN left (`infra.inference.kvcache`), on the `tiny` preset: the
next row given that slot, and a row whose columns a longer joiner widens over it, decode what
a full forward over their own tokens picks, their log-probs finite. The mask weighs a stale
column 0, and 0 times a stale NaN is NaN: a clean row would decode NaN from its second token on
(and leave NaN in its own slot for the row after it), failing for good as "its" policy's fault.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from contracts.task import SamplingParams
from infra.inference.decoder import Row, RowBatch
from infra.inference.kvcache import SlotLayer
from infra.inference.local import LoadedPolicy, _choose
from tests.infra.inference.test_kvcache import assert_greedy_exact, prompt

POISON = 200
"""A token whose embedding is NaN while `armed` (only the poisoned row's prefill: a clean row
may sample it, and its full forward must then be clean)."""


@pytest.fixture()
def armed(endless_policy: LoadedPolicy) -> Iterator[list[bool]]:
    """`[True]` while prefills of prompts holding `POISON` compute NaN keys and values."""
    state = [False]

    def poison(module: Any, inputs: Any, out: Any) -> Any:
        if not state[0]:
            return out
        out = out.clone()
        out[inputs[0] == POISON] = float("nan")
        return out

    hook = endless_policy.model.get_input_embeddings().register_forward_hook(poison)
    try:
        yield state
    finally:
        hook.remove()


def greedy(tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=tokens)


def poisoned_row(batch: RowBatch, length: int) -> Row:
    """A row of `length` prompt tokens, the first `POISON`: NaN in all its KV past the first
    layer's (budget 1)."""
    return batch.row([POISON, *prompt(length - 1, 7)], greedy(1))


def clean_row(batch: RowBatch, length: int, salt: int, tokens: int) -> Row:
    tokens_ = prompt(length, salt)
    assert POISON not in tokens_
    return batch.row(tokens_, greedy(tokens))


def admit_poisoned(batch: RowBatch, armed: list[bool], rows: list[Row]) -> None:
    armed[0] = True
    try:
        batch.admit(rows)
    finally:
        armed[0] = False


def running(batch: RowBatch, row: Row) -> bool:
    return any(r is row for r in batch.rows)


def run_until(batch: RowBatch, rows: list[Row]) -> None:
    """Step `batch` until every row of `rows` ended."""
    while any(running(batch, row) for row in rows):
        batch.step()


def assert_clean(policy: LoadedPolicy, row: Row) -> None:
    assert all(math.isfinite(x) for x in row.output.logprobs), row.output.logprobs
    assert_greedy_exact(policy, row)


def test_the_next_row_in_a_nan_rows_slot_decodes_clean(
    endless_policy: LoadedPolicy, armed: list[bool]
) -> None:
    batch = RowBatch(endless_policy, _choose)
    long = clean_row(batch, 40, 1, 60)
    bad = poisoned_row(batch, 33)
    admit_poisoned(batch, armed, [long, bad])
    batch.step()
    assert not running(batch, bad) and not math.isfinite(bad.output.logprobs[0])
    for k in range(3):  # each takes the slot the one before it left
        short = clean_row(batch, 5, 20 + k, 6)
        batch.admit([short])
        run_until(batch, [short])
        assert_clean(endless_policy, short)
    run_until(batch, [long])
    assert_clean(endless_policy, long)


def test_rows_a_longer_joiner_widens_over_a_nan_rows_columns_decode_clean(
    endless_policy: LoadedPolicy, armed: list[bool]
) -> None:
    batch = RowBatch(endless_policy, _choose)
    kept = clean_row(batch, 10, 2, 40)
    bad = poisoned_row(batch, 40)  # NaN over its slot's columns
    spare = clean_row(batch, 8, 3, 1)  # a third slot for the joiner below
    admit_poisoned(batch, armed, [kept, bad, spare])
    batch.step()  # `bad` and `spare` end; the columns only they held are trimmed
    assert len(batch.rows) == 1 and running(batch, kept)
    short = clean_row(batch, 5, 4, 12)
    batch.admit([short])  # into `bad`'s slot: its columns left of the batch's hold NaN
    batch.step()
    joiner = clean_row(batch, 60, 5, 8)
    batch.admit([joiner])  # the batch widens over them
    run_until(batch, [short, joiner, kept])
    for row in (short, joiner, kept):
        assert_clean(endless_policy, row)


def test_a_nan_rows_slot_is_zeroed_for_the_row_admitted_into_it(
    endless_policy: LoadedPolicy, armed: list[bool]
) -> None:
    """The cache itself: every live column left of a row's own holds zeros."""
    batch = RowBatch(endless_policy, _choose)
    long, bad = clean_row(batch, 30, 6, 30), poisoned_row(batch, 25)
    admit_poisoned(batch, armed, [long, bad])
    batch.step()
    short = clean_row(batch, 4, 8, 5)
    batch.admit([short])
    assert batch._cache is not None and len(batch.rows) == 2
    for layer in batch._cache.layers:
        assert isinstance(layer, SlotLayer) and layer.keys is not None and layer.values is not None
        for live in (layer.keys, layer.values):
            stale = live[1, :, : -len(short.prompt)]  # `short`'s slot, left of its own tokens
            assert torch.equal(stale, torch.zeros_like(stale))
