"""`AgentTaskWorkflow`: one task rolled out as a GRPO group of G samples, turn by turn.

Each turn is one batched activity per phase: GENERATE (all unsolved samples, queue `inference`),
EXECUTE (queue `sandbox`), then FEEDBACK in the workflow itself (rewards are a pure function of
the execution statuses). Failed samples carry their stored error logs into the next turn's
prompt; solved samples stop. At DONE each sample's trajectory is written once (queue `rewards`).

It is the one workflow that runs by the thousand, so it runs outside the SDK's sandbox (which
re-imports the workflow's modules for every run): `bench/orchestration.py` measured the Temporal
share of rollout wall time at 10.8% unsandboxed vs 15.8% sandboxed. Determinism is guarded by
the code itself (contracts and pure functions only) and by the recorded-history replay test.

Start one without Python (see README):
    temporal workflow start --task-queue agent-tasks --type AgentTaskWorkflow --input '{"task": …}'
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from pydantic import ValidationError

    from contracts.common import describe_validation_error
    from contracts.errors import ErrorType, fail
    from contracts.names import Activity, SearchAttr
    from contracts.rollout import (
        AgentTaskResult,
        GenerateItem,
        GenerateRequest,
        GenerateResponse,
        SampleState,
        TaskStatus,
        TurnRecord,
        WriteTrajectoriesRequest,
        WriteTrajectoriesResponse,
    )
    from contracts.sandbox import ExecStatus, ExecuteItem, ExecuteRequest, ExecuteResponse
    from contracts.task import AgentTaskInput
    from workflows.activity_options import activity_options
    from workflows.fsm import State, advance, after_feedback
    from workflows.search import search_attribute_updates

RESOURCE_FAILURES = frozenset({ExecStatus.TIMEOUT, ExecStatus.MEMORY_EXCEEDED})


def parse_task_input(raw: AgentTaskInput | dict[str, Any]) -> AgentTaskInput:
    """Validate the workflow input; a bad task fails the workflow (never retried) naming the field."""
    if isinstance(raw, AgentTaskInput):
        return raw
    try:
        return AgentTaskInput.model_validate(raw)
    except ValidationError as err:
        problems = describe_validation_error(err)
        raise fail(ErrorType.INVALID_TASK, f"invalid task: {problems}") from None


@workflow.defn(name="AgentTaskWorkflow", sandboxed=False)
class AgentTaskWorkflow:
    def __init__(self) -> None:
        self._state = State.INIT
        self._turn = 0
        self._samples: list[SampleState] = []
        self._policy_version: int | None = None
        self._aborted_reason: str | None = None
        self._published: dict[SearchAttr, object] = {}

    @workflow.run
    async def run(self, raw: AgentTaskInput | dict[str, Any]) -> AgentTaskResult:
        task_input = parse_task_input(raw)
        task = task_input.task
        self._samples = [SampleState(sample=i) for i in range(task_input.group_size)]
        workflow.upsert_memo(
            {
                "task": task.id,
                "suite": task.suite,
                "prompt": task.prompt[:200],
                "group_size": task_input.group_size,
                "max_turns": task_input.max_turns,
            }
        )

        for turn in range(task_input.max_turns):
            self._turn = turn
            active = [s for s in self._samples if not s.solved]
            self._move(State.GENERATE, task_input)
            generated = await self._generate(task_input, active)
            self._move(State.EXECUTE, task_input)
            executed = await self._execute(task_input, generated)
            self._move(State.FEEDBACK, task_input, publish=False)
            self._feedback(task_input, generated, executed)
            self._publish(task_input)  # FEEDBACK, with this turn's rewards
            next_state = after_feedback(
                all_solved=all(s.solved for s in self._samples),
                turn=turn,
                max_turns=task_input.max_turns,
                aborted=self._aborted_reason is not None,
            )
            if next_state is State.DONE:
                break

        self._move(State.DONE, task_input)
        written = await workflow.execute_activity(
            Activity.WRITE_TRAJECTORIES.value,
            WriteTrajectoriesRequest(
                run_id=task_input.run_id,
                task=task,
                group_size=task_input.group_size,
                samples=self._samples,
            ),
            result_type=WriteTrajectoriesResponse,
            **activity_options(Activity.WRITE_TRAJECTORIES, task_input.heartbeat_timeout_s),
        )
        return AgentTaskResult(
            run_id=task_input.run_id,
            task_id=task.id,
            state=self._state.value,
            turns=self._turn + 1,
            rewards=[s.reward for s in self._samples],
            solved=[s.solved for s in self._samples],
            best_reward=max(s.reward for s in self._samples),
            policy_versions=[s.turns[-1].policy_version for s in self._samples],
            trajectories=written.trajectories,
            aborted_reason=self._aborted_reason,
        )

    @workflow.query(name="status")
    def status(self) -> TaskStatus:
        return TaskStatus(
            state=self._state.value,
            turn=self._turn,
            policy_version=self._policy_version,
            samples=self._samples,
            aborted_reason=self._aborted_reason,
        )

    @workflow.signal(name="abort")
    def abort(self, reason: str) -> None:
        """Stop after the current turn (the circuit breaker, or an operator)."""
        self._aborted_reason = self._aborted_reason or (reason or "aborted by signal")

    async def _generate(
        self, task_input: AgentTaskInput, active: list[SampleState]
    ) -> GenerateResponse:
        request = GenerateRequest(
            run_id=task_input.run_id,
            task_id=task_input.task.id,
            turn=self._turn,
            prompt=task_input.task.prompt,
            sampling=task_input.sampling,
            policy_run=task_input.policy_run or task_input.run_id,
            policy_version=task_input.policy_version,
            items=[GenerateItem(sample=s.sample, history=s.turns) for s in active],
        )
        response = await workflow.execute_activity(
            Activity.GENERATE.value,
            request,
            result_type=GenerateResponse,
            **activity_options(Activity.GENERATE, task_input.heartbeat_timeout_s),
        )
        self._policy_version = response.policy_version
        return response

    async def _execute(
        self, task_input: AgentTaskInput, generated: GenerateResponse
    ) -> ExecuteResponse:
        request = ExecuteRequest(
            run_id=task_input.run_id,
            task_id=task_input.task.id,
            turn=self._turn,
            tests=task_input.task.tests,
            entry_point=task_input.task.entry_point,
            limits=task_input.limits,
            items=[ExecuteItem(sample=c.sample, code=c.code) for c in generated.completions],
        )
        return await workflow.execute_activity(
            Activity.EXECUTE.value,
            request,
            result_type=ExecuteResponse,
            **activity_options(Activity.EXECUTE, task_input.heartbeat_timeout_s),
        )

    def _feedback(
        self, task_input: AgentTaskInput, generated: GenerateResponse, executed: ExecuteResponse
    ) -> None:
        """Score this turn: a sample's reward counts its failed rounds; solved samples stop."""
        outcomes = {o.sample: o for o in executed.outcomes}
        for completion in generated.completions:
            sample = self._samples[completion.sample]
            outcome = outcomes[completion.sample]
            solved = outcome.status is ExecStatus.PASSED
            sample.solved = solved
            sample.reward = task_input.reward.score(
                [t.status is ExecStatus.PASSED for t in sample.turns] + [solved]
            )
            sample.turns.append(
                TurnRecord(
                    turn=self._turn,
                    policy_version=generated.policy_version,
                    completion=completion.completion,
                    code=completion.code,
                    num_tokens=completion.num_tokens,
                    status=outcome.status,
                    tests_passed=outcome.tests_passed,
                    tests_total=outcome.tests_total,
                    result=outcome.result,
                    reward=sample.reward,
                )
            )
        if task_input.abort_after and self._aborted_reason is None:
            resource_failures = sum(
                1 for s in self._samples for t in s.turns if t.status in RESOURCE_FAILURES
            )
            if resource_failures >= task_input.abort_after:
                self._aborted_reason = (
                    f"circuit breaker: {resource_failures} runs hit timeout or memory_exceeded "
                    f"(threshold {task_input.abort_after})"
                )

    def _move(self, target: State, task_input: AgentTaskInput, publish: bool = True) -> None:
        self._state = advance(self._state, target)
        if publish:
            self._publish(task_input)

    def _publish(self, task_input: AgentTaskInput) -> None:
        """Upsert the search attributes that changed since the last upsert (one event)."""
        current = {
            SearchAttr.STATE: self._state.value,
            SearchAttr.TURN: self._turn,
            SearchAttr.REWARD: max((s.reward for s in self._samples), default=0.0),
            SearchAttr.POLICY_VERSION: self._policy_version,
            SearchAttr.TASK_ID: task_input.task.id,
            SearchAttr.RUN_ID: task_input.run_id,
        }
        changed = {k: v for k, v in current.items() if self._published.get(k) != v}
        self._published.update(changed)
        if updates := search_attribute_updates(changed):
            workflow.upsert_search_attributes(updates)
