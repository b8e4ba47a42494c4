"""The learner's ledger (queue `rewards`): what each continue-as-new segment of a
`LearnerWorkflow` trained on, so the workflow's own state stays constant in size.

    record_ledger(LedgerSegment) -> ObjectRef         create-only at keys.learner_ledger_key;
                                                      a retry with the same ids is a no-op,
                                                      other ids a STORED_CONFLICT
    find_consumed(FindConsumedRequest) -> FindConsumedResponse
                                                      which of these task ids an earlier segment
                                                      already took (a re-sent group)

Segments are written once and never change, so this worker keeps the ones it has read (as sets
of ids) and reads each at most once per learner (`FindConsumedRequest.chain`: a run id used
again after `tempered runs rm` has new segments under the same keys). A stored segment that is
not a valid document fails without retry (`activities/stored.py`). Served by `tempered worker
rewards` next to `write_trajectories`: the ledger is about the same trajectories, and needs
only the store.
"""

from __future__ import annotations

import asyncio
import functools

from temporalio import activity

from activities.stored import parse_model
from contracts.common import ObjectRef
from contracts.errors import ErrorType, fail, invalid
from contracts.learner import FindConsumedRequest, FindConsumedResponse, LedgerSegment
from contracts.names import Activity
from infra import keys
from infra.storage import ObjectExists, ObjectNotFound, ObjectStore, ref_of

CACHED_SEGMENTS = 4096
"""Segments kept in memory (each a set of task ids; 50 steps × groups per step)."""


class LedgerActivities:
    """Activities of the learner's ledger; hold the object store."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store
        self._segment = functools.lru_cache(maxsize=CACHED_SEGMENTS)(self._read_segment)

    @activity.defn(name=Activity.RECORD_LEDGER.value)
    async def record_ledger(self, segment: LedgerSegment) -> ObjectRef:
        """Store `segment` once; the same ids again (a retry) return the stored ref."""
        return await asyncio.to_thread(self._record, segment)

    @activity.defn(name=Activity.FIND_CONSUMED.value)
    async def find_consumed(self, request: FindConsumedRequest) -> FindConsumedResponse:
        """The ids of `request.task_ids` that ledger segments 0 … segments − 1 list."""
        return await asyncio.to_thread(self._find, request)

    def _record(self, segment: LedgerSegment) -> ObjectRef:
        """The same bytes again are the store's to accept (a create-only write of identical
        content returns the stored ref); the same ids in another form (an earlier release's
        JSON) are accepted here, by comparing the documents."""
        key = keys.learner_ledger_key(segment.run_id, segment.segment)
        try:
            return self.store.put_json(key, segment, create_only=True)
        except ObjectExists:
            data = self.store.get_bytes(key)
            stored = parse_model("segment", key, data, LedgerSegment)
            if stored != segment:
                raise fail(
                    ErrorType.STORED_CONFLICT,
                    f"{key} already lists other task ids for steps "
                    f"{stored.first_step}–{stored.next_step - 1}",
                ) from None
            return ref_of(key, data)

    def _find(self, request: FindConsumedRequest) -> FindConsumedResponse:
        asked = set(request.task_ids)
        found: set[str] = set()
        for segment in range(request.segments):
            found |= asked & self._segment(request.run_id, request.chain, segment)
        return FindConsumedResponse(consumed=sorted(found))

    def _read_segment(self, run_id: str, chain: str, segment: int) -> frozenset[str]:
        del chain  # a key of the cache only
        key = keys.learner_ledger_key(run_id, segment)
        try:
            data = self.store.get_bytes(key)
        except ObjectNotFound:
            raise invalid("segments", f"ledger segment {key} does not exist") from None
        return frozenset(parse_model("segments", key, data, LedgerSegment).consumed)
