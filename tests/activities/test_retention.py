"""The `prune_policies` activity heartbeats while it deletes (the deletion itself:
tests/infra/test_retention.py; the bound it is given: tests/workflows/test_retention.py)."""

from __future__ import annotations

import time

import pytest
from temporalio.testing import ActivityEnvironment

import activities.retention
from activities.retention import RetentionActivities
from contracts.run import PrunePoliciesRequest
from infra.storage import ObjectStore


@pytest.mark.asyncio
async def test_a_slow_prune_heartbeats_while_it_runs(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once it ran in a thread without heartbeating: a prune slower than the run's heartbeat
    timeout timed out, was retried ten times and the versions were kept."""

    def slow(store: ObjectStore, run_id: str, below: int) -> list[int]:
        time.sleep(1.5)
        return [1, 2]

    monkeypatch.setattr(activities.retention, "prune_below", slow)
    monkeypatch.setattr(activities.retention, "HEARTBEAT_S", 0.2)
    env = ActivityEnvironment()
    beats: list[tuple[object, ...]] = []
    env.on_heartbeat = lambda *details: beats.append(details)
    request = PrunePoliciesRequest(run_id="r", below=3)
    pruned = await env.run(RetentionActivities(store).prune_policies, request)
    assert pruned.deleted == [1, 2]
    assert len(beats) >= 3
