"""A run with `keep_versions` deletes its old policy versions as it trains, never one that a
rollout or an evaluation in flight still reads (workflows/retention.py), on the time-skipping
test server with the scripted control plane (tests/workflows/control_plane.py). The store side
(which blobs go) is tests/infra/test_retention.py, against SeaweedFS."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.exceptions import ApplicationError

from contracts.names import Activity, Queue
from contracts.run import (
    PrunePoliciesRequest,
    PrunePoliciesResponse,
    TrainingRunInput,
    TrainingRunResult,
)
from infra.storage import ObjectStore
from tests.fixtures.temporal import time_skipping_server
from tests.workflows.control_plane import (
    ScriptedSuite,
    ScriptedTrainer,
    StandInAgentTask,
    control_plane,
    run_to_end,
)
from tests.workflows.test_training_run import RUN
from workflows.retention import PRUNE_ATTEMPTS

READ_POLICY = "read_policy"


class ScriptedVersions:
    """`prune_policies` over the scripted trainer's versions, and `read_policy`: what a rollout
    does with its version when it ends (a pruned one fails it, and with it the run)."""

    def __init__(self) -> None:
        self.pruned: set[int] = set()
        self.bounds: list[int] = []
        self.reads: dict[int, int] = {}

    @activity.defn(name=Activity.PRUNE_POLICIES.value)
    async def prune_policies(self, request: PrunePoliciesRequest) -> PrunePoliciesResponse:
        self.bounds.append(request.below)
        doomed = set(range(1, request.below)) - self.pruned
        self.pruned |= doomed
        return PrunePoliciesResponse(deleted=sorted(doomed))

    @activity.defn(name=READ_POLICY)
    async def read_policy(self, version: int) -> None:
        self.reads[version] = self.reads.get(version, 0) + 1
        if version in self.pruned:
            raise ApplicationError(f"policy version {version} was deleted", non_retryable=True)


@workflow.defn(name="AgentTaskWorkflow", sandboxed=False)
class ReadingAgentTask(StandInAgentTask):
    """The stand-in task, reading its policy version once its group is done."""

    @workflow.run
    async def run(self, raw: dict[str, Any]) -> dict[str, Any]:
        result = await super().run(raw)
        await workflow.execute_activity(
            READ_POLICY,
            int(raw.get("policy_version") or 0),
            task_queue=Queue.REWARDS.value,
            start_to_close_timeout=timedelta(seconds=30),
        )
        return result


@pytest.mark.asyncio
@pytest.mark.parametrize("keep", [1, 3])
async def test_old_versions_go_as_the_run_trains_and_none_still_read(
    store: ObjectStore, keep: int
) -> None:
    """20 steps, evaluations every 4, tasks of 1-30 s pinned to the newest version when they
    start, across continue-as-new: every rollout and evaluation finds its version at its end,
    the bound only rises, and rises as the run goes, and the run ends holding version 0 and its
    newest `keep` alone."""
    run = RUN.model_copy(
        update={"run_id": f"keep-{keep}", "steps": 20, "eval_every": 4, "keep_versions": keep}
    )
    versions = ScriptedVersions()
    rewards = [versions.prune_policies, versions.read_policy]
    async with (
        time_skipping_server() as env,
        control_plane(
            env.client,
            store,
            ScriptedSuite(train=30, heldout=2),
            ScriptedTrainer(),
            agent_task=ReadingAgentTask,
            rewards=rewards,
        ),
    ):
        result, continued = await run_to_end(env.client, run, f"train-keep-{keep}")
    assert continued, "no continue-as-new"
    assert result.steps == run.steps and len(result.evals) == 6  # v0, 4, 8, 12, 16 and 20
    assert versions.bounds == sorted(set(versions.bounds)), "a bound went back or repeated"
    # as the run trains, not only where a segment ends (14 and 17 bounds of 20 steps seen; a
    # version whose readers never count down held every bound back to 2 or 3 a run)
    assert len(versions.bounds) >= run.steps // 2, versions.bounds
    assert versions.pruned == set(range(1, run.steps - keep + 1))  # v0 and the newest `keep` left
    old_reads = [v for v in versions.reads if 0 < v <= run.steps - keep]
    assert old_reads, "no rollout read a version that was later deleted: the test shows nothing"


async def run_with_prunes(
    store: ObjectStore,
    run: TrainingRunInput,
    prune_policies: Callable[[PrunePoliciesRequest], Awaitable[PrunePoliciesResponse]],
    workflow_id: str,
) -> TrainingRunResult:
    """`run` to its end on the time-skipping server, its prunes served by `prune_policies`."""
    async with (
        time_skipping_server() as env,
        control_plane(
            env.client,
            store,
            ScriptedSuite(train=30),
            ScriptedTrainer(),
            rewards=[prune_policies],
        ),
    ):
        result, _ = await run_to_end(env.client, run, workflow_id)
    return result


class RefusingVersions(ScriptedVersions):
    """A store that refuses every delete, as an infrastructure error (retryable)."""

    @activity.defn(name=Activity.PRUNE_POLICIES.value)
    async def prune_policies(self, request: PrunePoliciesRequest) -> PrunePoliciesResponse:
        self.bounds.append(request.below)
        raise RuntimeError("AccessDenied: the credentials may not delete")


@pytest.mark.asyncio
async def test_a_store_that_refuses_deletes_costs_the_run_nothing(store: ObjectStore) -> None:
    """Each prune is tried `PRUNE_ATTEMPTS` times, then logged: before, retried without end,
    it held the run's continue-as-new and its ending for good."""
    run = RUN.model_copy(update={"run_id": "refused", "steps": 6, "keep_versions": 1})
    versions = RefusingVersions()
    result = await run_with_prunes(store, run, versions.prune_policies, "train-refused")
    assert result.steps == run.steps
    assert versions.bounds and len(versions.bounds) % PRUNE_ATTEMPTS == 0, versions.bounds
