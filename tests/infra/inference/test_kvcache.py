"""The local backend's KV store (`infra.inference.kvcache`) on the `tiny` preset: rows that join
(longer than the batch, past the spare slots), leave (their slots filled from the tail) and
decode past the spare columns still get the tokens a plain full forward picks, and a decode
step appends in place instead of copying the cache.
"""

from __future__ import annotations

import torch

from contracts.task import SamplingParams
from infra.inference.decoder import Row, RowBatch
from infra.inference.kvcache import LEFT_ROOM, SlotLayer, compaction
from infra.inference.local import LoadedPolicy, _choose


def prompt(length: int, salt: int) -> list[int]:
    return [3 + (7 * salt + 13 * k) % 250 for k in range(length)]


def assert_greedy_exact(policy: LoadedPolicy, row: Row) -> None:
    """The row's tokens are the full forward's argmax at every position, and its log-probs
    those of the full forward (which a wrong key or value anywhere in its context changes)."""
    ids, completion = row.prompt, row.output.token_ids
    with torch.inference_mode():
        logits = policy.model(input_ids=torch.tensor([ids + completion])).logits[0]
    logprobs = torch.log_softmax(logits[len(ids) - 1 : -1].float(), dim=-1)
    assert logits[len(ids) - 1 : -1].argmax(-1).tolist() == completion
    forced = logprobs.gather(-1, torch.tensor(completion)[:, None])[:, 0]
    assert (forced - torch.tensor(row.output.logprobs)).abs().max() < 1e-4


def drain_exact(policy: LoadedPolicy, batch: RowBatch, rows: list[Row]) -> None:
    """Step `batch` until every row ended; each of `rows` is then greedy-exact."""
    while batch.rows:
        batch.step()
    for row in rows:
        assert_greedy_exact(policy, row)


def first_layer(batch: RowBatch) -> SlotLayer:
    """The batch's first cache layer."""
    assert batch._cache is not None
    layer = batch._cache.layers[0]
    assert isinstance(layer, SlotLayer)
    return layer


def kbuf(layer: SlotLayer) -> torch.Tensor:
    """The layer's key buffer (all its slots and columns), allocated."""
    assert layer.kbuf is not None
    return layer.kbuf


def test_compaction_fills_holes_from_the_tail() -> None:
    assert compaction(6, [1, 4]) == [0, 5, 2, 3]
    assert compaction(4, [3]) == [0, 1, 2]
    assert compaction(3, [0, 1]) == [2]
    assert compaction(5, []) == [0, 1, 2, 3, 4]


def test_joining_leaving_and_long_decodes_keep_greedy_exact(endless_policy: LoadedPolicy) -> None:
    batch = RowBatch(endless_policy, _choose)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=150)  # past the 64 spare columns
    first = [batch.row(prompt(6, 0), greedy), batch.row(prompt(9, 1), greedy)]
    batch.admit(first)
    for _ in range(5):
        batch.step()
    # longer than the batch by more than its left room, and more rows than its slots
    short = SamplingParams(temperature=0.0, max_new_tokens=3)
    joiners = [batch.row(prompt(60, 2 + i), short if i % 2 else greedy) for i in range(5)]
    assert 6 + 5 + LEFT_ROOM < 60
    batch.admit(joiners)
    ended: list[int] = []
    while batch.rows:
        ended.extend(id(row) for row in batch.step())
    assert len(ended) == 7
    for row in first + joiners:
        assert len(row.output.token_ids) == row.budget
        assert_greedy_exact(endless_policy, row)


def test_a_decode_step_appends_in_place(endless_policy: LoadedPolicy) -> None:
    batch = RowBatch(endless_policy, _choose)
    params = SamplingParams(temperature=0.0, max_new_tokens=20)
    batch.admit([batch.row(prompt(8, s), params) for s in range(4)])
    batch.step()
    layer = first_layer(batch)
    buffer, columns = kbuf(layer).data_ptr(), layer.hi - layer.lo
    batch.step()
    assert kbuf(layer).data_ptr() == buffer  # the same storage, one column more
    assert layer.hi - layer.lo == columns + 1
    assert (
        layer.keys is not None and layer.keys.data_ptr() == kbuf(layer)[0, 0, layer.lo].data_ptr()
    )


def test_a_row_that_ends_is_replaced_by_the_last_row_only(endless_policy: LoadedPolicy) -> None:
    batch = RowBatch(endless_policy, _choose)
    long = SamplingParams(temperature=0.0, max_new_tokens=12)
    rows = [batch.row(prompt(8, s), long) for s in range(4)]
    rows[1].budget = 2  # ends first, at its second token
    batch.admit(rows)
    layer = first_layer(batch)
    lo, hi = layer.lo, layer.hi
    kept = kbuf(layer)[2, :, lo:hi].clone()
    batch.step()
    batch.step()
    assert batch.rows == [rows[0], rows[3], rows[2]]  # row 3 took row 1's slot; row 2 stayed
    assert torch.equal(kbuf(layer)[2, :, lo:hi], kept)
    drain_exact(endless_policy, batch, rows)


def test_rows_joining_one_by_one_grow_the_slots_by_half(endless_policy: LoadedPolicy) -> None:
    batch = RowBatch(endless_policy, _choose)
    params = SamplingParams(temperature=0.0, max_new_tokens=20)
    batch.admit([batch.row(prompt(8, s), params) for s in range(4)])
    layer = first_layer(batch)
    batch.admit([batch.row(prompt(8, 4), params)])  # a fifth row: 4 slots become 6
    assert kbuf(layer).shape[0] == 6
    buffer = kbuf(layer).data_ptr()
    batch.admit([batch.row(prompt(8, 5), params)])  # a sixth fits without a copy
    assert kbuf(layer).data_ptr() == buffer and layer.n == 6


def test_columns_that_only_padding_holds_go_when_the_longest_row_ends(
    endless_policy: LoadedPolicy,
) -> None:
    batch = RowBatch(endless_policy, _choose)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    rows = [batch.row(prompt(40, 0), greedy), batch.row(prompt(6, 1), greedy)]
    rows.append(batch.row(prompt(8, 2), greedy))
    rows[0].budget = 2  # the longest ends first
    batch.admit(rows)
    layer = first_layer(batch)
    batch.step()
    assert layer.hi - layer.lo == 40 + 1
    batch.step()  # row 0 ends: 32 leading columns are padding in every row left
    assert rows[0] not in batch.rows and layer.hi - layer.lo == 8 + 2
    drain_exact(endless_policy, batch, rows)


def test_a_longer_row_joining_free_slots_widens_the_batch(endless_policy: LoadedPolicy) -> None:
    batch = RowBatch(endless_policy, _choose)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    rows = [batch.row(prompt(6, s), greedy) for s in range(4)]
    rows[0].budget = rows[1].budget = 1
    batch.admit(rows)
    batch.step()  # rows 0 and 1 end: 2 of 4 slots are free
    layer = first_layer(batch)
    assert layer.n == 2
    joiner = batch.row(prompt(6 + 1 + LEFT_ROOM + 20, 9), greedy)  # wider than the left room
    batch.admit([joiner])
    assert kbuf(layer).shape[0] == 4 and layer.hi - layer.lo == len(joiner.prompt)
    drain_exact(endless_policy, batch, [*rows, joiner])


def test_rows_are_kept_in_any_order_not_only_a_compactions() -> None:
    layer = SlotLayer()
    keys = torch.arange(3.0)[:, None, None, None].expand(3, 1, 4, 2).clone()
    layer.admit(keys, keys + 10)
    layer.batch_select_indices(torch.tensor([2, 0, 1]))
    assert layer.keys is not None and layer.values is not None
    assert layer.keys[:, 0, 0, 0].tolist() == [2, 0, 1]
    assert layer.values[:, 0, -1, 1].tolist() == [12, 10, 11]
    layer.batch_select_indices(torch.tensor([1, 1]))  # a row copied (as a shared prefill is)
    assert layer.keys[:, 0, 0, 0].tolist() == [0, 0] and layer.n == 2
