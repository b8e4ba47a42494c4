"""The local backend's KV store (`infra.inference.kvcache`) on the `tiny` preset: rows that join
(longer than the batch, past the spare slots), leave (their slots filled from the tail) and
decode past the spare columns still get the tokens a plain full forward picks, and a decode
step appends in place instead of copying the cache.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from contracts.task import SamplingParams
from infra.inference.decoder import Row, RowBatch
from infra.inference.kvcache import LEFT_ROOM, SlotLayer, compaction
from infra.inference.local import LoadedPolicy, _choose, load_policy
from infra.policy import materialize_base_model
from infra.settings import Settings


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> LoadedPolicy:
    home = tmp_path_factory.getbasetemp() / "home"
    tiny: Path = materialize_base_model("tiny", Settings(home=home))
    loaded = load_policy(str(tiny), torch.device("cpu"))
    return dataclasses.replace(loaded, eos_ids=frozenset())  # every row runs its budget


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


def test_compaction_fills_holes_from_the_tail() -> None:
    assert compaction(6, [1, 4]) == [0, 5, 2, 3]
    assert compaction(4, [3]) == [0, 1, 2]
    assert compaction(3, [0, 1]) == [2]
    assert compaction(5, []) == [0, 1, 2, 3, 4]


def test_joining_leaving_and_long_decodes_keep_greedy_exact(policy: LoadedPolicy) -> None:
    batch = RowBatch(policy, _choose)
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
        assert_greedy_exact(policy, row)


def test_a_decode_step_appends_in_place(policy: LoadedPolicy) -> None:
    batch = RowBatch(policy, _choose)
    params = SamplingParams(temperature=0.0, max_new_tokens=20)
    batch.admit([batch.row(prompt(8, s), params) for s in range(4)])
    batch.step()
    assert batch._cache is not None
    layer = batch._cache.layers[0]
    assert isinstance(layer, SlotLayer) and layer.kbuf is not None
    buffer, columns = layer.kbuf.data_ptr(), layer.hi - layer.lo
    batch.step()
    assert layer.kbuf.data_ptr() == buffer  # the same storage, one column more
    assert layer.hi - layer.lo == columns + 1
    assert layer.keys is not None and layer.keys.data_ptr() == layer.kbuf[0, 0, layer.lo].data_ptr()


def test_a_row_that_ends_is_replaced_by_the_last_row_only(policy: LoadedPolicy) -> None:
    batch = RowBatch(policy, _choose)
    long = SamplingParams(temperature=0.0, max_new_tokens=12)
    rows = [batch.row(prompt(8, s), long) for s in range(4)]
    rows[1].budget = 2  # ends first, at its second token
    batch.admit(rows)
    assert batch._cache is not None
    layer = batch._cache.layers[0]
    assert isinstance(layer, SlotLayer) and layer.kbuf is not None
    lo, hi = layer.lo, layer.hi
    kept = layer.kbuf[2, :, lo:hi].clone()
    batch.step()
    batch.step()
    assert batch.rows == [rows[0], rows[3], rows[2]]  # row 3 took row 1's slot; row 2 stayed
    assert torch.equal(layer.kbuf[2, :, lo:hi], kept)
    drain_exact(policy, batch, rows)


def test_rows_joining_one_by_one_grow_the_slots_by_half(policy: LoadedPolicy) -> None:
    batch = RowBatch(policy, _choose)
    params = SamplingParams(temperature=0.0, max_new_tokens=20)
    batch.admit([batch.row(prompt(8, s), params) for s in range(4)])
    assert batch._cache is not None
    layer = batch._cache.layers[0]
    assert isinstance(layer, SlotLayer) and layer.kbuf is not None
    batch.admit([batch.row(prompt(8, 4), params)])  # a fifth row: 4 slots become 6
    assert layer.kbuf.shape[0] == 6
    buffer = layer.kbuf.data_ptr()
    batch.admit([batch.row(prompt(8, 5), params)])  # a sixth fits without a copy
    assert layer.kbuf.data_ptr() == buffer and layer.n == 6


def test_columns_that_only_padding_holds_go_when_the_longest_row_ends(policy: LoadedPolicy) -> None:
    batch = RowBatch(policy, _choose)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    rows = [batch.row(prompt(40, 0), greedy), batch.row(prompt(6, 1), greedy)]
    rows.append(batch.row(prompt(8, 2), greedy))
    rows[0].budget = 2  # the longest ends first
    batch.admit(rows)
    assert batch._cache is not None
    layer = batch._cache.layers[0]
    assert isinstance(layer, SlotLayer)
    batch.step()
    assert layer.hi - layer.lo == 40 + 1
    batch.step()  # row 0 ends: 32 leading columns are padding in every row left
    assert rows[0] not in batch.rows and layer.hi - layer.lo == 8 + 2
    drain_exact(policy, batch, rows)


def test_a_longer_row_joining_free_slots_widens_the_batch(policy: LoadedPolicy) -> None:
    batch = RowBatch(policy, _choose)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    rows = [batch.row(prompt(6, s), greedy) for s in range(4)]
    rows[0].budget = rows[1].budget = 1
    batch.admit(rows)
    batch.step()  # rows 0 and 1 end: 2 of 4 slots are free
    assert batch._cache is not None
    layer = batch._cache.layers[0]
    assert isinstance(layer, SlotLayer) and layer.kbuf is not None and layer.n == 2
    joiner = batch.row(prompt(6 + 1 + LEFT_ROOM + 20, 9), greedy)  # wider than the left room
    batch.admit([joiner])
    assert layer.kbuf.shape[0] == 4 and layer.hi - layer.lo == len(joiner.prompt)
    drain_exact(policy, batch, [*rows, joiner])


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
