"""The `prune_policies` activity (queue `rewards`): delete a training run's policy versions below
a bound while it trains, with the blobs only they name (`infra.retention.prune_below`), the
workspace snapshots of its episodes that are done (`infra.retention.prune_snapshots`: those
whose trajectory is written, which nothing restores again), and the stored parts of its
learner's groups that nothing reads again (`infra.retention.prune_step_parts`: those of each
step below the newest acknowledged one, read by the store's acks, not by the bound).

The bound is the workflow's to choose (`workflows/retention.py`: version 0, the newest
`keep_versions` and every version still read stay), with the bound its last prune reached
(`since`: only the versions from it are looked at). This side only deletes, never a version
that a reader outside the run marks (`tempered eval`, `infra.retention.reading`); a retried call
finishes the prune a failed attempt began (the blobs go before the manifests that name them),
and a repeated one deletes nothing more. Served by `tempered worker rewards`, which holds the store.
It heartbeats while it deletes: a prune of many versions may outlast the heartbeat timeout.
"""

from __future__ import annotations

import asyncio

from temporalio import activity

from activities.heartbeat import heartbeating
from contracts.names import Activity
from contracts.run import PrunePoliciesRequest, PrunePoliciesResponse
from infra.retention import prune_below, prune_snapshots, prune_step_parts
from infra.storage import ObjectStore


class RetentionActivities:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    @activity.defn(name=Activity.PRUNE_POLICIES.value)
    async def prune_policies(self, request: PrunePoliciesRequest) -> PrunePoliciesResponse:
        deleted = await heartbeating(
            asyncio.to_thread(
                prune_below, self.store, request.run_id, request.below, since=request.since
            ),
        )
        if deleted:
            activity.logger.info("run %s: deleted policy versions %s", request.run_id, deleted)
        swept = await heartbeating(asyncio.to_thread(prune_snapshots, self.store, request.run_id))
        if swept:
            activity.logger.info("run %s: deleted %d snapshot objects", request.run_id, swept)
        parts = await heartbeating(asyncio.to_thread(prune_step_parts, self.store, request.run_id))
        if parts:
            activity.logger.info("run %s: deleted %d parts of learner steps", request.run_id, parts)
        return PrunePoliciesResponse(deleted=deleted)
