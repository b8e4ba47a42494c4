"""The learner's ledger against a real SeaweedFS: a segment is written once (a retry with the
same ids is a no-op, even where the stored JSON differs in form; other ids are a non-retryable
conflict), `find_consumed` looks only at the segments written so far and reads each once, and a
segment that should exist and does not fails without retry; a run id used again (another
learner chain) reads its own segments. The learner workflow's use of it is
tests/workflows/test_learner.py's."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.ledger import LedgerActivities
from contracts.errors import ErrorType
from contracts.learner import FindConsumedRequest, LedgerSegment
from infra import keys
from infra.storage import ObjectStore

RUN = "run-ledger"


def segment(number: int, consumed: list[str]) -> LedgerSegment:
    return LedgerSegment(
        run_id=RUN,
        segment=number,
        first_step=3 * number,
        next_step=3 * number + 3,
        consumed=consumed,
    )


@pytest.mark.asyncio
async def test_a_segment_is_written_once(store: ObjectStore) -> None:
    acts, env = LedgerActivities(store), ActivityEnvironment()
    first = await env.run(acts.record_ledger, segment(0, ["a", "b"]))
    assert first.key == keys.learner_ledger_key(RUN, 0) and store.head(first.key) == first
    assert await env.run(acts.record_ledger, segment(0, ["a", "b"])) == first  # a retry
    with pytest.raises(ApplicationError, match="other task ids for steps 0–2") as refused:
        await env.run(acts.record_ledger, segment(0, ["a", "c"]))
    assert refused.value.type == ErrorType.STORED_CONFLICT and refused.value.non_retryable
    assert store.get_model(first.key, LedgerSegment).consumed == ["a", "b"]

    # stored by a release that wrote its JSON otherwise: the same ids, so still a retry
    other_form = segment(1, ["d"]).model_dump_json(indent=2).encode()
    stored = store.put_bytes(keys.learner_ledger_key(RUN, 1), other_form)
    assert await env.run(acts.record_ledger, segment(1, ["d"])) == stored


@pytest.mark.asyncio
async def test_consumed_ids_come_from_the_segments_written_so_far_each_read_once(
    store: ObjectStore,
) -> None:
    acts, env = LedgerActivities(store), ActivityEnvironment()
    for number, consumed in enumerate([["a", "b"], ["c"], ["d"]]):
        await env.run(acts.record_ledger, segment(number, consumed))
    asked = FindConsumedRequest(run_id=RUN, segments=2, task_ids=["d", "c", "x", "a"])
    assert (await env.run(acts.find_consumed, asked)).consumed == ["a", "c"]  # not segment 2's
    none = asked.model_copy(update={"segments": 0})
    assert (await env.run(acts.find_consumed, none)).consumed == []
    for number in range(3):
        store.delete(keys.learner_ledger_key(RUN, number))
    assert (await env.run(acts.find_consumed, asked)).consumed == ["a", "c"]  # kept, not reread
    with pytest.raises(ApplicationError, match="ledger-000002.json does not exist") as missing:
        await env.run(acts.find_consumed, asked.model_copy(update={"segments": 3}))
    assert missing.value.type == ErrorType.INVALID_INPUT and missing.value.non_retryable


@pytest.mark.asyncio
async def test_a_run_id_used_again_reads_its_own_segments(store: ObjectStore) -> None:
    acts, env = LedgerActivities(store), ActivityEnvironment()
    await env.run(acts.record_ledger, segment(0, ["t-0", "t-1"]))
    first = FindConsumedRequest(run_id=RUN, segments=1, task_ids=["t-0", "t-2"], chain="one")
    assert (await env.run(acts.find_consumed, first)).consumed == ["t-0"]
    store.delete(keys.learner_ledger_key(RUN, 0))  # `tempered runs rm`, then the same run id
    await env.run(acts.record_ledger, segment(0, ["t-2"]))
    again = first.model_copy(update={"chain": "two"})
    assert (await env.run(acts.find_consumed, again)).consumed == ["t-2"]  # not the old t-0
