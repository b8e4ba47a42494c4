"""A training run's held-out evaluations, as children of `TrainingRunWorkflow`.

    evaluations = Evaluations(run_input, kept_results, retention, run_task, failed, children)
    evaluations.heldout = spread(tasks.heldout, run_input.heldout_limit)   # the suite's
    evaluations.start(version)          # one greedy episode per held-out task (children)
    evaluations.children_ahead(...)     # what may still start: the run's history look-ahead
    evaluations.kept()                  # what a continue-as-new carries

An evaluation of version v runs every held-out task as an `AgentTaskWorkflow` child of up to
`eval_turns` turns; pass@1 counts those solved at turn 1, the solve rate all solved
(`EvalResult.of`). The run starts one before training, every `eval_every` learner steps and
after the last; each reads its version for as long as it runs (`Retention`). Each child counts
in the run's pending children (`children`, workflows/children.py) and waits for room there; an
evaluation starts at most `EVAL_WINDOW` of its children at a time (`PENDING_CHILDREN_PATCH`).
Only version 0's result (the baseline) and the last `EVAL_TAIL` others cross a continue-as-new
(`BASELINE_PATCH`). A child that fails makes its evaluation raise what `failed` returns (the
run's failure, at once: workflows/run_failure.py), or, before that, the child's failure. Without
those patches it issues exactly the commands the run issued before this was its own module (the
recorded histories replay).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from temporalio import workflow
from temporalio.exceptions import FailureError

with workflow.unsafe.imports_passed_through():
    from contracts.evaluation import EvalResult
    from contracts.names import eval_run_id
    from contracts.rollout import AgentTaskResult
    from contracts.run import TrainingRunInput
    from contracts.task import AgentTaskInput, TaskSpec
    from workflows.children import PENDING_CHILDREN_PATCH, PendingChildren
    from workflows.retention import Retention

ONCE_PATCH = "tempered-run-evaluates-once"
"""Marks runs that skip a second start of one version's evaluation (before: its children's ids
were taken, and the run failed at its end)."""
BASELINE_PATCH = "tempered-run-keeps-its-baseline"
"""Marks runs whose continue-as-new carries version 0's evaluation, where the first to finish
(which it kept before) was another version's (asked only then)."""
EVAL_TAIL = 32
"""Evaluations the run keeps besides version 0's (before training)."""
EVAL_WINDOW = 100
"""Held-out tasks one evaluation has in flight at most (`PENDING_CHILDREN_PATCH`): a suite of
thousands of them would take every slot of the run's pending children, and one workflow task
would start them all."""

RunTask = Callable[[AgentTaskInput, str], Awaitable[AgentTaskResult]]
"""How the run executes one agent task as its child: (input, workflow id) → result."""
Failed = Callable[[TaskSpec, int, FailureError], Exception | None]
"""What an evaluation raises when a child fails: (held-out task, version, its failure) → the
error, or None for the child's own failure."""


class Evaluations:
    def __init__(
        self,
        run_input: TrainingRunInput,
        results: Sequence[EvalResult],
        retention: Retention,
        run_task: RunTask,
        failed: Failed,
        children: PendingChildren,
    ) -> None:
        self._input, self._retention, self._run_task = run_input, retention, run_task
        self._failed, self._children = failed, children
        self.results: list[EvalResult] = list(results)
        self.heldout: list[TaskSpec] = []
        self.jobs: list[asyncio.Task[None]] = []
        self.in_flight = 0  # children of evaluations running
        self._started = {e.policy_version for e in self.results}  # and those running

    def start(self, version: int) -> None:
        """Evaluate `version` (in the background; `jobs` holds it), once: a stopped run's last
        step may be a periodic one, whose evaluation started before the run's ending asks."""
        if version in self._started and workflow.patched(ONCE_PATCH):
            return
        self._started.add(version)
        self.jobs.append(self._retention.start(version, self._evaluate(version)))

    def measured(self, version: int) -> bool:
        return any(e.policy_version == version for e in self.results)

    @property
    def idle(self) -> bool:
        return all(job.done() for job in self.jobs)

    def kept(self) -> list[EvalResult]:
        """The results a continue-as-new carries: version 0's and the last `EVAL_TAIL` others.
        Before `BASELINE_PATCH`, the first to finish took version 0's place: a later version's,
        if its held-out tasks ran faster, and version 0's then fell out of the tail."""
        kept = self.results[:1] + self.results[1:][-EVAL_TAIL:]
        baseline = next((e for e in self.results if e.policy_version == 0), None)
        if baseline is None or baseline in kept or not workflow.patched(BASELINE_PATCH):
            return kept
        return [baseline, *[e for e in self.results if e is not baseline][-EVAL_TAIL:]]

    def children_ahead(self, started: int, learner_steps: int, ending: bool) -> int:
        """Children running, and those of the evaluations that may start before the run's
        children in flight are done: one per `eval_every` learner steps that the groups
        started so far (and the next) allow, and, at the `ending`, the one after the last step."""
        run_input, every = self._input, self._input.eval_every
        reachable = min((started + 1) // run_input.grpo.groups_per_step, run_input.steps - 1)
        periodic = max(reachable // every - learner_steps // every, 0) if every else 0
        return self.in_flight + len(self.heldout) * (periodic + int(ending))

    async def _evaluate(self, version: int) -> None:
        run_input = self._input
        if not self.heldout:
            return
        eval_run = eval_run_id(run_input.run_id, version)
        windowed = len(self.heldout) > EVAL_WINDOW and workflow.patched(PENDING_CHILDREN_PATCH)
        self.in_flight += len(self.heldout)  # started or not: the history look-ahead's count
        try:
            if windowed:
                results = await self._windowed(eval_run, version)
            else:
                results = await asyncio.gather(
                    *(self._run_one(t, eval_run, version) for t in self.heldout)
                )
        finally:
            self.in_flight -= len(self.heldout)
        self.results.append(EvalResult.of(version, results, run_input.eval_turns, self.heldout))

    async def _windowed(self, eval_run: str, version: int) -> list[AgentTaskResult]:
        """Each held-out task's child in turn, `EVAL_WINDOW` of them in flight at most; none
        more once one failed (the evaluation raises that)."""
        jobs: list[asyncio.Task[AgentTaskResult]] = []

        def running() -> int:
            return sum(1 for job in jobs if not job.done())

        for task in self.heldout:
            if running() >= EVAL_WINDOW:
                await workflow.wait_condition(lambda: running() < EVAL_WINDOW)
            if any(job.done() and (job.cancelled() or job.exception()) for job in jobs):
                break
            jobs.append(asyncio.create_task(self._run_one(task, eval_run, version)))
        return list(await asyncio.gather(*jobs))

    async def _run_one(self, task: TaskSpec, eval_run: str, version: int) -> AgentTaskResult:
        task_input = self._input.eval_input(task, eval_run, version)
        await self._children.room()
        self._children.started()
        try:
            return await self._run_task(task_input, f"{eval_run}-{task.id}")
        except FailureError as exc:
            error = self._failed(task, version, exc)
            if error is None:
                raise
            raise error from exc
        finally:
            self._children.ended()
