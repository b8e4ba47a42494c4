"""The `prune_policies` activity deletes from the bound the run's last prune reached (`since`),
and the snapshots of the episodes that are done, and heartbeats while it deletes, as often as
its heartbeat timeout needs (the deletion itself: tests/infra/test_retention*.py; the bounds it
is given: tests/workflows/test_retention*.py)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

import activities.retention
from activities.retention import RetentionActivities
from contracts.names import Activity
from contracts.run import PrunePoliciesRequest, PrunePoliciesResponse
from infra.storage import ObjectStore
from tests.activities.heartbeats import timing_out_after
from tests.fixtures.temporal import TemporalServer
from tests.infra.test_retention_bounds import publish_fakes, published
from tests.infra.test_retention_snapshots import done, folder, stepped

QUEUE = "prune-heartbeats"


@pytest.mark.asyncio
async def test_a_prune_told_the_last_bound_looks_only_above_it(store: ObjectStore) -> None:
    """`since`: versions below it were deleted by the run's earlier prunes (a store that keeps
    listing their folders made each prune read them all again)."""
    publish_fakes(store, "told", range(6))
    request = PrunePoliciesRequest(run_id="told", below=4, since=3)
    pruned = await ActivityEnvironment().run(RetentionActivities(store).prune_policies, request)
    assert pruned.deleted == [3] and published(store, "told", 6) == [0, 1, 2, 4, 5]
    request = PrunePoliciesRequest(run_id="told", below=4)  # an older run's: every version
    pruned = await ActivityEnvironment().run(RetentionActivities(store).prune_policies, request)
    assert pruned.deleted == [1, 2] and published(store, "told", 6) == [0, 4, 5]


@pytest.mark.asyncio
async def test_a_prune_deletes_the_snapshots_of_the_episodes_that_are_done(
    store: ObjectStore,
) -> None:
    """As the run goes: an episode's snapshots once its trajectory is written, and no other's."""
    for sample in (0, 1):
        stepped(store, "swept", "t", sample)
    done(store, "swept", "t", 0)
    request = PrunePoliciesRequest(run_id="swept", below=2)
    await ActivityEnvironment().run(RetentionActivities(store).prune_policies, request)
    assert not folder(store, "swept", "t", 0) and len(folder(store, "swept", "t", 1)) == 5


def slow(store: ObjectStore, run_id: str, below: int, since: int | None = None) -> list[int]:
    time.sleep(2.5)
    return [1, 2]


@pytest.mark.asyncio
async def test_a_slow_prune_heartbeats_while_it_runs(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once it ran in a thread without heartbeating: a prune slower than the run's heartbeat
    timeout timed out, was retried ten times and the versions were kept."""
    monkeypatch.setattr(activities.retention, "prune_below", slow)
    env = timing_out_after(0.6)
    beats: list[tuple[object, ...]] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    request = PrunePoliciesRequest(run_id="r", below=3)
    pruned = await env.run(RetentionActivities(store).prune_policies, request)
    assert pruned.deleted == [1, 2]
    assert len(beats) >= 6  # every 0.2 s: a third of its heartbeat timeout


@workflow.defn(name="PruneWithin1sHeartbeats", sandboxed=False)
class PruneWithin1sHeartbeats:
    @workflow.run
    async def run(self, request: PrunePoliciesRequest) -> PrunePoliciesResponse:
        return await workflow.execute_activity(
            Activity.PRUNE_POLICIES.value,
            request,
            result_type=PrunePoliciesResponse,
            task_queue=QUEUE,
            start_to_close_timeout=timedelta(seconds=30),
            heartbeat_timeout=timedelta(seconds=1),  # the least a run's contract allows
            retry_policy=RetryPolicy(maximum_attempts=1),
        )


@pytest.mark.asyncio
async def test_a_prune_outlasting_a_1s_heartbeat_timeout_is_not_timed_out(
    store: ObjectStore,
    monkeypatch: pytest.MonkeyPatch,
    temporal_server: TemporalServer,
    namespace: str,
) -> None:
    """A real server times the activity out: heartbeats every 5 s whatever the timeout timed
    out every attempt of a 2.5 s prune under a 1 s heartbeat timeout (retried for ever)."""
    monkeypatch.setattr(activities.retention, "prune_below", slow)
    client = await Client.connect(
        temporal_server.address, namespace=namespace, data_converter=pydantic_data_converter
    )
    acts = RetentionActivities(store)
    async with Worker(
        client,
        task_queue=QUEUE,
        workflows=[PruneWithin1sHeartbeats],
        activities=[acts.prune_policies],
    ):
        pruned = await client.execute_workflow(
            PruneWithin1sHeartbeats.run,
            PrunePoliciesRequest(run_id="r", below=3),
            id="prune-1s-heartbeats",
            task_queue=QUEUE,
        )
    assert pruned.deleted == [1, 2]
