"""Re-score a run's stored trajectories without generating: what `tempered regrade` does.

Each trajectory's final program runs against the task's tests *as the task suite defines them
now*, through a sandbox backend, with platform failures retried as every offline path retries
them (`infra/sandbox/retrying.py`). The new reward comes from the one reward formula
(`RewardConfig.score`, which the workflow's FEEDBACK also calls): earlier rounds keep their
recorded verdicts, the final round gets the new one. One `RewardRecord` per trajectory is
written create-only at `keys.reward_key(run, grader, task, sample)`; old records are never
overwritten, and a rerun with the same verdicts is a no-op: records are compared by their
verdict (`VERDICT`), never by `detail`, the checker's stderr tail, which a rerun of the same
verdict need not reproduce (a timeout cuts it elsewhere; a set's repr follows the hash seed).

A task is found by its id, but an id may name another problem now than when the run sampled it
(a suite redrew its instances: `starter-add-8` was "plus 12", now "plus 7"). A trajectory whose
stored prompt (`Trajectory.prompt`, the task's own prompt as the run had it) is not the task's
prompt now is skipped, and says so, never graded against the other problem. Skipped too: a task
the suite no longer has (tagged `NOT_IN_SUITE` as well: another suite may have it), a
`workspace` episode (its verifier grades it), a trajectory without a program.

A training run's trajectory names its task as the run drew it (`<id>-e<epoch>`,
`contracts.run.drawn_task`); `contracts.run.suite_task_id` gives the suite id it is looked up by.

    grading = Regrading(store, backend, "v2", "starter", limits=…, reward=…, concurrency=8)
    outcome = await grading.run_stored(run_id, tasks)      # read from the store as it goes
    outcome = await grading.run_all(trajectories, tasks)   # any iterable, a lazy one too

Trajectories are read as grading goes, and at most `READ_AHEAD` × `concurrency` are held at once
(each holds its token ids, mask and log-probs: ~330 kB for 4,096 tokens), never a whole run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TypeVar

from pydantic import ValidationError

from contracts.episode import EpisodeEnd
from contracts.errors import INFRA_RETRY, Backoff
from contracts.run import suite_task_id
from contracts.sandbox import ExecStatus
from contracts.task import EnvName, RewardConfig, SandboxLimits, TaskSpec
from contracts.trajectory import RewardRecord, Trajectory
from infra import keys
from infra.sandbox.base import SandboxBackend
from infra.sandbox.retrying import run_retrying
from infra.storage import ObjectExists, ObjectStore

NOT_IN_SUITE = "not_in_suite"
"""The tag of a skip another suite may help (the task is not in this one), besides `skipped`:
a workspace episode, a trajectory without a program or a task that is another problem now are
skipped under any suite."""

OUTCOMES = ("regraded", "changed", "unchanged", "conflict", "skipped", "infra", NOT_IN_SUITE)
"""What `Regrading.run_all` counts; a trajectory lands in one or two of them."""

VERDICT = ("status", "tests_passed", "tests_total", "solved", "reward")
"""The fields of a RewardRecord that a rerun must reproduce for its record to count as the same."""

READ_AHEAD = 2
"""Trajectories held at once, per sandbox slot: one running, one read and waiting for a slot."""

Item = TypeVar("Item")


class Regrading:
    """Re-scores trajectories through a sandbox backend and writes one RewardRecord each."""

    def __init__(
        self,
        store: ObjectStore,
        backend: SandboxBackend,
        grader: str,
        suite: str,
        *,
        limits: SandboxLimits,
        reward: RewardConfig,
        concurrency: int,
        max_turns: int | None = None,
        backoff: Backoff = INFRA_RETRY,
    ):
        """`max_turns`: the run's, for an episode its context cut short (`RewardConfig.score`'s
        `cut_short_of`); None leaves such an episode's turns not taken unscored."""
        self.store, self.backend, self.grader, self.suite = store, backend, grader, suite
        self.limits, self.reward, self.backoff = limits, reward, backoff
        self.max_turns = max_turns
        self.concurrency, self.gate = concurrency, asyncio.Semaphore(concurrency)

    def _cut(self, trajectory: Trajectory) -> int | None:
        return self.max_turns if trajectory.end is EpisodeEnd.CONTEXT_BUDGET else None

    async def run_all(
        self, trajectories: Iterable[Trajectory], tasks: Mapping[str, TaskSpec]
    ) -> dict[str, list[str]]:
        """Regrade every trajectory; `{outcome: sorted(["<trajectory id>[: note]", ...])}`.
        `trajectories` is drawn from as grading goes (in a thread: a lazy one may read)."""

        async def given(trajectory: Trajectory) -> Trajectory:
            return trajectory

        return await self._each(trajectories, given, tasks)

    async def run_stored(self, run_id: str, tasks: Mapping[str, TaskSpec]) -> dict[str, list[str]]:
        """`run_all` of every trajectory stored for `run_id`, each read when a slot is free.
        ValueError for one that is not a trajectory, StorageError where the store fails: the
        verdicts written before are kept (create-only), and a rerun with the same grader
        resumes (an identical verdict is a no-op)."""

        async def read(key: str) -> Trajectory:
            try:
                return await asyncio.to_thread(self.store.get_model, key, Trajectory)
            except ValidationError as exc:  # one line, naming it: pydantic's spans several
                why = exc.errors()[0]["msg"] if exc.errors() else str(exc)
                where = f"s3://{self.store.bucket}/{key}"
                raise ValueError(f"{where} is not a trajectory ({why})") from exc

        return await self._each(self.store.list_keys(keys.trajectories_prefix(run_id)), read, tasks)

    async def _each(
        self,
        items: Iterable[Item],
        load: Callable[[Item], Awaitable[Trajectory]],
        tasks: Mapping[str, TaskSpec],
    ) -> dict[str, list[str]]:
        """Regrade the trajectory `load` makes of each of `items`, `READ_AHEAD` × concurrency
        at a time: each worker holds one trajectory, and `items` is drawn one at a time."""
        outcome: dict[str, list[str]] = {kind: [] for kind in OUTCOMES}
        source, drawing = iter(items), asyncio.Lock()

        async def worker() -> None:
            while True:
                async with drawing:  # a generator is advanced by one thread at a time
                    item = await asyncio.to_thread(next, source, None)
                if item is None:
                    return
                trajectory = await load(item)
                for kind, note in await self.one(trajectory, tasks):
                    outcome[kind].append(f"{trajectory.id}: {note}" if note else trajectory.id)

        await asyncio.gather(*(worker() for _ in range(READ_AHEAD * self.concurrency)))
        return {kind: sorted(lines) for kind, lines in outcome.items()}

    async def one(
        self, trajectory: Trajectory, tasks: Mapping[str, TaskSpec]
    ) -> list[tuple[str, str]]:
        """Regrade one trajectory against its task of `tasks` (by `suite_task_id`)."""
        name = suite_task_id(trajectory.run_id, trajectory.task_id)
        task = tasks.get(name)
        if task is None:
            return [
                ("skipped", f"task {name!r} is not in suite {self.suite!r}"),
                (NOT_IN_SUITE, ""),
            ]
        if trajectory.prompt != task.prompt:
            return [
                (
                    "skipped",
                    f"task {name!r} of suite {self.suite!r} is another problem "
                    "now (its prompt is not the one the run sampled): not regraded against it",
                )
            ]
        if trajectory.env is not EnvName.CODE:
            return [("skipped", f"a {trajectory.env} episode is graded by its verifier")]
        final = trajectory.steps[-1].code if trajectory.steps else None
        if final is None:
            return [("skipped", "trajectory has no program")]
        attempted = await run_retrying(
            self.backend,
            final,
            task.tests,
            self.limits,
            task.entry_point,
            helpers=task.helpers,
            hidden_tests=task.hidden_tests,
            gate=self.gate,
            backoff=self.backoff,
        )
        result = attempted.result
        if result is None:
            tries = self.backoff.offline_attempts
            return [("infra", f"sandbox kept failing after {tries} attempts: {attempted.detail}")]
        solved = result.status == ExecStatus.PASSED
        earlier = [step.status == ExecStatus.PASSED for step in trajectory.steps[:-1]]
        record = RewardRecord(
            trajectory_id=trajectory.id,
            grader=self.grader,
            suite=self.suite,
            status=result.status,
            tests_passed=result.tests_passed,
            tests_total=result.tests_total,
            solved=solved,
            reward=self.reward.score([*earlier, solved], cut_short_of=self._cut(trajectory)),
            previous_solved=trajectory.solved,
            previous_reward=trajectory.reward,
            detail="" if solved else result.stderr[-400:],
        )
        key = keys.reward_key(trajectory.run_id, self.grader, trajectory.task_id, trajectory.sample)
        try:
            await asyncio.to_thread(self.store.put_json, key, record, create_only=True)
        except ObjectExists:  # a rerun: only a different verdict is a conflict
            stored = await asyncio.to_thread(self.store.get_model, key, RewardRecord)
            if any(getattr(stored, field) != getattr(record, field) for field in VERDICT):
                return [
                    (
                        "conflict",
                        f"{key} holds a different verdict (a changed suite, or flaky tests?); kept it",
                    )
                ]
        return [("regraded", ""), ("changed" if solved != trajectory.solved else "unchanged", "")]
