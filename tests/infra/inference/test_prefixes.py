"""An episode's next step prefills only its new tokens (`infra.inference.prefixes`), on the `tiny`
preset: the row of a prompt that extends a finished row's tokens starts from that row's KV and
still samples what a full forward over its whole prompt picks; the store is bounded by bytes and
keeps versions apart.
"""

from __future__ import annotations

import pytest
import torch

from contracts.task import SamplingParams
from infra.inference.decoder import RowBatch
from infra.inference.local import LoadedPolicy, _choose
from infra.inference.prefixes import PrefixStore
from tests.infra.inference.test_kvcache import assert_greedy_exact, prompt

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


def run(batch: RowBatch, prompts: list[list[int]]) -> list[list[int]]:
    rows = [batch.row(p, GREEDY) for p in prompts]
    batch.admit(rows)
    while batch.rows:
        batch.step()
    return [row.output.token_ids for row in rows]


@pytest.fixture()
def store() -> PrefixStore:
    return PrefixStore(max_bytes=64 << 20)


def test_a_next_step_prefills_only_its_new_tokens_and_stays_greedy_exact(
    endless_policy: LoadedPolicy, store: PrefixStore
) -> None:
    batch = RowBatch(endless_policy, _choose, store.version("v1"))
    firsts = [prompt(20, s) for s in range(3)]
    completions = run(batch, firsts)
    # the next step: the previous prompt and completion, then an observation
    nexts = [
        p + c + prompt(7, 10 + s) for s, (p, c) in enumerate(zip(firsts, completions, strict=True))
    ]
    nexts.append(prompt(30, 9))  # a prompt no row ended with: prefilled whole
    rows = [batch.row(p, GREEDY) for p in nexts]
    batch.admit(rows)
    assert store.hits == 3
    assert store.reused_tokens == sum(
        len(p) + len(c) - 1 for p, c in zip(firsts, completions, strict=True)
    )
    while batch.rows:
        batch.step()
    for row in rows:
        assert_greedy_exact(endless_policy, row)


def test_prefixes_stay_with_their_version_and_leave_least_recent_first(
    endless_policy: LoadedPolicy,
) -> None:
    one_row = PrefixStore(max_bytes=1 << 40)
    run(RowBatch(endless_policy, _choose, one_row.version("v1")), [prompt(16, 0)])
    size = one_row.bytes
    store = PrefixStore(max_bytes=2 * size + size // 2)  # room for two rows of this length
    batch = RowBatch(endless_policy, _choose, store.version("v1"))
    firsts = [prompt(16, s) for s in range(3)]
    completions = [run(batch, [p])[0] for p in firsts]  # one by one: stored in this order
    assert store.bytes == 2 * size
    nexts = [p + c + [5] for p, c in zip(firsts, completions, strict=True)]
    assert store.version("v2").take(nexts[2]) is None  # another version's weights
    assert store.version("v1").take(nexts[0]) is None  # the oldest left
    hit = store.version("v1").take(nexts[2])
    assert hit is not None and hit.length == len(nexts[2]) - 2
    assert store.version("v1").take(nexts[2]) is None  # taken once
    store.forget("v1")
    assert store.bytes == 0 and store.version("v1").take(nexts[1]) is None


def test_no_store_means_whole_prefills(endless_policy: LoadedPolicy) -> None:
    off = PrefixStore(max_bytes=0)
    batch = RowBatch(endless_policy, _choose, off.version("v1"))
    first = prompt(10, 1)
    completion = run(batch, [first])[0]
    run(batch, [first + completion + [7]])
    assert off.hits == 0 and off.bytes == 0


def kv(tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One layer's keys and values for `tokens` tokens: 16 bytes a token."""
    return [(torch.zeros(1, 1, tokens, 2), torch.zeros(1, 1, tokens, 2))]


def test_a_prompt_is_never_its_own_prefix_and_the_bound_is_inclusive() -> None:
    store = PrefixStore(max_bytes=16 * 10).version("v1")
    store.put(list(range(10)), kv(10))  # exactly the bound: kept
    assert store.store.bytes == 160
    assert store.take(list(range(10))) is None  # no token left to prefill
    assert store.take(list(range(11))).length == 10  # type: ignore[union-attr]
    store.put(list(range(10)), kv(10))
    store.put([7] * 11, kv(11))  # over the bound on its own: not kept, evicts nothing
    assert store.store.bytes == 160 and store.take([7] * 12) is None
    store.put([], [])  # nothing processed: nothing kept
    assert store.take([1]) is None and store.take(list(range(12))).length == 10  # type: ignore[union-attr]


def test_prefixes_of_one_length_are_each_found() -> None:
    store = PrefixStore(max_bytes=1 << 20).version("v1")
    store.put([1] * 10, kv(10))  # two episodes' rows of the same length
    store.put([2] * 10, kv(10))
    assert store.take([1] * 11) is not None and store.take([2] * 11) is not None
