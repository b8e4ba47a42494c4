"""Which policy versions a training run may delete while it trains (`keep_versions` N).

    retention = Retention(run_input, pruned_below=1)
    task = retention.start(version, self._rollout_one(task, version))   # reads `version`
    retention.published(latest)          # a new version: prune what left the window
    await retention.drain()              # before continue-as-new
    await retention.finish(latest)       # at the run's end

Kept: version 0, the newest N, and every version that a rollout or an evaluation started and
not yet finished reads (the bound moves only past the oldest of those); an evaluation the run
did not start (`tempered eval --run`) marks its version in the store, which the activity keeps.
Deleting is the `prune_policies` activity's (queue `rewards`, infra/retention.py); one runs at a
time, each deleting below a higher bound than the last and told the bound of the last one that
succeeded (`since`: the store reads only the versions between the two), so a run of S steps
deletes S - N versions in at most S activities, each reading about the versions it deletes.
N = 0 keeps every version and issues no command at all, as the run did before this existed (its
recorded histories replay unchanged; a prune's input is not compared on replay).

A prune that fails for good is logged, and the versions stay (the next prune looks at them
again, unless the run continued as new meanwhile): losing disk space is never worth failing a
run over, nor waiting on. An infrastructure error is retried `PRUNE_ATTEMPTS` times (about 4
minutes of backoff), not without limit: a store that refuses deletes (say, credentials
that may write but not delete) once held the run's continue-as-new and ending for good. What
stays is swept by `tempered runs prune` once the run has finished.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Coroutine
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from contracts.names import Activity
    from contracts.run import PrunePoliciesRequest, PrunePoliciesResponse, TrainingRunInput
    from workflows.activity_options import activity_options

T = TypeVar("T")
PRUNE_ATTEMPTS = 10
"""Tries of one prune: a store outage of minutes is waited out, a refusal is not."""


class Retention:
    def __init__(self, run_input: TrainingRunInput, pruned_below: int) -> None:
        self._input = run_input
        self.pruned_below = pruned_below
        """Versions 1 .. this - 1 are deleted (or being deleted)."""
        self._swept_below = pruned_below  # the bound of the last prune that succeeded
        self._reading: Counter[int] = Counter()
        self._job: asyncio.Task[None] | None = None

    def start(self, version: int, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """`work` as a task that reads `version`: kept from now until the task ends."""
        self._reading[version] += 1

        async def reading() -> T:
            try:
                return await work
            finally:
                self._reading[version] -= 1
                if not self._reading[version]:
                    del self._reading[version]

        return asyncio.create_task(reading())

    def published(self, latest: int) -> None:
        """`latest` is out: delete what it leaves behind the window, if anything."""
        keep = self._input.keep_versions
        if not keep:
            return
        below = min([latest - keep + 1, *self._reading])
        if below <= self.pruned_below:
            return
        self.pruned_below = below  # taken now: the next call deletes only above this one
        self._job = asyncio.create_task(self._prune(below, self._job))

    async def finish(self, latest: int) -> None:
        """The run's end: nothing reads a version but `latest` and version 0 any more."""
        self.published(latest)
        await self.drain()

    async def drain(self) -> None:
        """Wait for the prunes started so far."""
        if self._job is not None:
            await self._job

    @property
    def idle(self) -> bool:
        return self._job is None or self._job.done()

    async def _prune(self, below: int, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            await previous
        request = PrunePoliciesRequest(
            run_id=self._input.run_id, below=below, since=self._swept_below
        )
        try:
            await workflow.execute_activity(
                Activity.PRUNE_POLICIES.value,
                request,
                result_type=PrunePoliciesResponse,
                **activity_options(
                    Activity.PRUNE_POLICIES,
                    self._input.heartbeat_timeout_s,
                    attempts=PRUNE_ATTEMPTS,
                ),
            )
            self._swept_below = below
        except ActivityError as err:
            workflow.logger.warning("policy versions below %d kept: %s", below, err.cause or err)
