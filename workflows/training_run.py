"""`TrainingRunWorkflow`: one training run, end to end (what `tempered train` starts).

Loads the task suite (quarantined tasks skipped), publishes policy version 0, starts the
`LearnerWorkflow` as a child, and keeps `concurrency` `AgentTaskWorkflow` children in flight
until `steps × groups_per_step` groups have been rolled out (or the time budget is spent). Each
finished group is signalled to the learner; rollouts go on while it trains (asynchronous RL)
but never run more than `grpo.max_staleness` steps ahead of it: the group for step b waits for
version b − max_staleness and is pinned to the newest version known when it starts
(`max_staleness = 0` is synchronous, on-policy GRPO). Held-out pass@1 is measured before training, every `eval_every`
learner steps, and after the last step, through the same agent-task pipeline (greedy, one turn).
"""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta
from functools import partial

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contracts.errors import ErrorType, fail
    from contracts.learner import (
        EvalResult,
        LearnerInput,
        LearnerProgress,
        LoadTasksRequest,
        LoadTasksResponse,
        PolicyVersion,
        PrepareRunRequest,
        RunProgress,
        TrainingRunInput,
        TrainingRunResult,
        TrajectoryGroup,
    )
    from contracts.names import Activity, Queue, SearchAttr
    from contracts.rollout import AgentTaskResult
    from contracts.task import AgentTaskInput, TaskSpec, eval_task_input
    from workflows.activity_options import activity_options
    from workflows.agent_task import AgentTaskWorkflow
    from workflows.learner import LearnerWorkflow
    from workflows.search import search_attribute_updates


@workflow.defn(name="TrainingRunWorkflow")
class TrainingRunWorkflow:
    @workflow.init
    def __init__(self, run_input: TrainingRunInput) -> None:
        self._input = run_input
        self._progress: list[LearnerProgress] = []
        self._evals: list[EvalResult] = []
        self._eval_jobs: list[asyncio.Task[None]] = []
        self._heldout: list[TaskSpec] = []
        self._in_flight = 0
        self._started = 0
        self._done = 0

    @workflow.run
    async def run(self, run_input: TrainingRunInput) -> TrainingRunResult:
        workflow.upsert_search_attributes(
            search_attribute_updates({SearchAttr.RUN_ID: run_input.run_id})
        )
        tasks = await workflow.execute_activity(
            Activity.LOAD_TASKS.value,
            LoadTasksRequest(suite=run_input.suite),
            result_type=LoadTasksResponse,
            **activity_options(Activity.LOAD_TASKS, run_input.heartbeat_timeout_s),
        )
        if not tasks.train:
            raise fail(
                ErrorType.INVALID_TASK, f"suite {run_input.suite!r} has no training tasks left"
            )
        self._heldout = tasks.heldout
        base = await workflow.execute_activity(
            Activity.PREPARE_RUN.value,
            PrepareRunRequest(
                run_id=run_input.run_id, base_model=run_input.base_model, run=run_input
            ),
            result_type=PolicyVersion,
            **activity_options(Activity.PREPARE_RUN, max(run_input.heartbeat_timeout_s, 120)),
        )
        self._start_eval(base.version)
        learner = await workflow.start_child_workflow(
            LearnerWorkflow.run,
            LearnerInput(
                run_id=run_input.run_id,
                config=run_input.grpo,
                max_steps=run_input.steps,
                parent_workflow_id=workflow.info().workflow_id,
            ),
            id=self._learner_id(),
            task_queue=Queue.AGENT_TASKS.value,
        )
        await self._roll_out(tasks.train)
        await workflow.get_external_workflow_handle(self._learner_id()).signal(
            LearnerWorkflow.finish
        )
        final = await learner
        if final.history and not any(
            e.policy_version == final.history[-1].policy.version for e in self._evals
        ):
            self._start_eval(final.history[-1].policy.version)
        await asyncio.gather(*self._eval_jobs)
        return TrainingRunResult(
            run_id=run_input.run_id,
            steps=final.step,
            tasks_started=self._started,
            tasks_done=self._done,
            history=final.history,
            evals=sorted(self._evals, key=lambda e: e.policy_version),
        )

    @workflow.signal(name="learner_progress")
    def learner_progress(self, progress: LearnerProgress) -> None:
        self._progress.append(progress)
        every = self._input.eval_every
        if every and progress.step % every == 0 and progress.step < self._input.steps:
            self._start_eval(progress.policy_version)

    @workflow.query(name="progress")
    def progress(self) -> RunProgress:
        return RunProgress(
            tasks_started=self._started,
            tasks_done=self._done,
            in_flight=self._in_flight,
            learner=self._progress,
            evals=self._evals,
        )

    def _learner_id(self) -> str:
        return f"{workflow.info().workflow_id}-learner"

    async def _roll_out(self, train: list[TaskSpec]) -> None:
        run_input = self._input
        total = run_input.steps * run_input.grpo.groups_per_step
        order = list(train)
        random.Random(run_input.seed).shuffle(order)  # same order for the same seed, every run
        deadline = (
            workflow.now() + timedelta(seconds=run_input.time_budget_s)
            if run_input.time_budget_s
            else None
        )
        jobs: list[asyncio.Task[None]] = []
        per_step, lag = run_input.grpo.groups_per_step, run_input.grpo.max_staleness
        for index in range(total):
            # bounded staleness: the group for learner step b is sampled from a version ≥ b − lag
            await workflow.wait_condition(partial(self._may_start, index // per_step - lag))
            if deadline is not None and workflow.now() >= deadline:
                break
            epoch, position = divmod(index, len(order))
            task = order[position].model_copy(update={"id": f"{order[position].id}-e{epoch}"})
            jobs.append(asyncio.create_task(self._rollout_one(task, self._latest_version)))
        await asyncio.gather(*jobs)

    def _may_start(self, min_learner_steps: int) -> bool:
        """A slot is free and the learner is far enough along for the next group."""
        in_flight_ok = self._in_flight < self._input.concurrency
        return in_flight_ok and self._learner_steps >= min_learner_steps

    @property
    def _learner_steps(self) -> int:
        return max((p.step for p in self._progress), default=0)

    @property
    def _latest_version(self) -> int:
        """Newest published policy version the learner has told us of (pinned per rollout)."""
        return max((p.policy_version for p in self._progress), default=0)

    async def _rollout_one(self, task: TaskSpec, policy_version: int) -> None:
        run_input = self._input
        self._in_flight += 1
        self._started += 1
        try:
            result = await self._agent_task(
                AgentTaskInput(
                    task=task,
                    run_id=run_input.run_id,
                    group_size=run_input.group_size,
                    max_turns=run_input.max_turns,
                    sampling=run_input.sampling,
                    reward=run_input.reward,
                    limits=run_input.limits,
                    policy_version=policy_version,
                    heartbeat_timeout_s=run_input.heartbeat_timeout_s,
                ),
                workflow_id=f"{run_input.run_id}-task-{task.id}",
            )
        finally:
            self._in_flight -= 1
        self._done += 1
        await workflow.get_external_workflow_handle(self._learner_id()).signal(
            LearnerWorkflow.add_groups,
            [
                TrajectoryGroup(
                    task_id=task.id,
                    trajectories=result.trajectories,
                    rewards=result.rewards,
                    policy_version=min(result.policy_versions),
                )
            ],
        )

    def _start_eval(self, version: int) -> None:
        self._eval_jobs.append(asyncio.create_task(self._evaluate(version)))

    async def _evaluate(self, version: int) -> None:
        """Held-out pass@1 of `version`: one greedy sample, one turn, per held-out task."""
        run_input = self._input
        if not self._heldout:
            return
        eval_run = f"{run_input.run_id}-eval-v{version}"
        results = await asyncio.gather(
            *(
                self._agent_task(
                    eval_task_input(
                        task,
                        run_id=eval_run,
                        policy_run=run_input.run_id,
                        policy_version=version,
                        sampling=run_input.eval_sampling,
                        limits=run_input.limits,
                        heartbeat_timeout_s=run_input.heartbeat_timeout_s,
                    ),
                    workflow_id=f"{eval_run}-{task.id}",
                )
                for task in self._heldout
            )
        )
        solved = sum(1 for r in results if r.solved[0])
        self._evals.append(
            EvalResult(policy_version=version, pass_at_1=solved / len(results), tasks=len(results))
        )

    async def _agent_task(self, task_input: AgentTaskInput, workflow_id: str) -> AgentTaskResult:
        return await workflow.execute_child_workflow(
            AgentTaskWorkflow.run,
            task_input,
            id=workflow_id,
            task_queue=Queue.AGENT_TASKS.value,
        )
