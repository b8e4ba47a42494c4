"""Each prune a training run starts is told the bound its last one reached (`since`), so the
store reads only the versions between the two (workflows/retention.py; what the store does with
it: tests/infra/test_retention_bounds.py). A prune that failed for good does not move it: the
next one looks at the versions that one left too. Time-skipping test server, scripted control
plane (tests/workflows/control_plane.py)."""

from __future__ import annotations

import pytest
from temporalio import activity

from contracts.names import Activity
from contracts.run import PrunePoliciesRequest, PrunePoliciesResponse
from infra.storage import ObjectStore
from tests.workflows.test_retention import ScriptedVersions, run_with_prunes
from tests.workflows.test_training_run import RUN
from workflows.retention import PRUNE_ATTEMPTS


class TellingVersions(ScriptedVersions):
    """Records each call's (since, below); every call of the third prune fails."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int | None, int]] = []

    @activity.defn(name=Activity.PRUNE_POLICIES.value)
    async def prune_policies(self, request: PrunePoliciesRequest) -> PrunePoliciesResponse:
        self.calls.append((request.since, request.below))
        if len({below for _, below in self.calls}) == 3:
            raise RuntimeError("SlowDown: the store is busy")
        return await super().prune_policies(request)


@pytest.mark.asyncio
async def test_each_prune_starts_from_the_bound_the_last_one_reached(store: ObjectStore) -> None:
    run = RUN.model_copy(update={"run_id": "since", "steps": 8, "keep_versions": 1})
    versions = TellingVersions()
    result = await run_with_prunes(store, run, versions.prune_policies, "train-since")
    assert result.steps == run.steps
    calls = list(dict.fromkeys(versions.calls))  # a failed prune's retries, once
    assert len(calls) >= 4 and calls[0][0] == 1, calls
    failed = calls[2]
    assert versions.calls.count(failed) == PRUNE_ATTEMPTS, versions.calls
    for (since, below), (next_since, _) in zip(calls, calls[1:], strict=False):
        assert next_since == (since if (since, below) == failed else below), calls
