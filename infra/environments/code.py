"""The `code` environment: write one function; the action is the answer, the observation its
test log.

    env = CodeEnvironment(get_backend(settings))
    state = await env.reset(task, "s0")
    state, observation = await env.step(state, program, limits)   # the tests run
    graded = await env.verify(task, state, limits)                # the last answer, again

Stateless between steps (the state is the task and the last answer), so there is no session
and nothing to snapshot. In a training run the step is the `execute` activity
(activities/sandbox.py), which batches a group's answers through the same backend call,
`SandboxBackend.run(program, task.tests, limits, task.entry_point, ...)`; this class is that
call behind the environment Protocol, for code that drives environments directly (validation,
benchmarks, a plain asyncio loop).

The observation after a failed turn is the checker's report, which quotes the failing assert
of the task's `tests` (expected value included). The verdict also runs the task's
`hidden_tests` (`TaskSpec.hidden_tests`; the `starter` suite holds half its asserts there), of
which the observation says only "a hidden test failed (<exception type>)" and the count passed,
so a program that special-cases what it was shown still fails them. Not covered: tasks without
hidden tests (HumanEval, user suites that give none), where the feedback still quotes the very
asserts the verdict is graded on; and the hidden inputs, which the program sees as arguments
and may print into its own output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts.common import ObjectRef
from contracts.episode import ToolSpec
from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import EnvName, SandboxLimits, TaskSpec
from infra.environments.base import Graded, Observation
from infra.sandbox.base import SandboxBackend


@dataclass(frozen=True)
class CodeState:
    task: TaskSpec
    program: str = ""
    """The last answer ("" before the first)."""


def test_log(result: ExecutionResult) -> str:
    """What the model reads of a run: its status, then what the program and tests printed."""
    lines = [f"status: {result.status.value} ({result.tests_passed}/{result.tests_total} tests)"]
    if result.detail:
        lines.append(result.detail)
    lines += [text.rstrip() for text in (result.stdout, result.stderr) if text.strip()]
    return "\n".join(lines)


class CodeEnvironment:
    """Function tasks run against their tests by a sandbox backend."""

    name = EnvName.CODE
    tools: tuple[ToolSpec, ...] = ()

    def __init__(self, backend: SandboxBackend) -> None:
        self.backend = backend

    async def reset(
        self, task: TaskSpec, session_id: str, snapshot: ObjectRef | None = None
    ) -> CodeState:
        return CodeState(task)

    async def step(
        self, state: CodeState, action: str, limits: SandboxLimits, number: int | None = None
    ) -> tuple[CodeState, Observation]:
        """Run `action` against the tests (`number` unused: a step changes no state here)."""
        result = await self._run(state.task, action, limits)
        passed = result.status is ExecStatus.PASSED
        return CodeState(state.task, action), Observation(test_log(result), result.status, passed)

    async def verify(self, task: TaskSpec, state: CodeState, limits: SandboxLimits) -> Graded:
        result = await self._run(task, state.program, limits)
        return Graded(result, 1.0 if result.status is ExecStatus.PASSED else 0.0)

    async def close(self, session_ids: Sequence[str]) -> int:
        return 0

    async def _run(self, task: TaskSpec, program: str, limits: SandboxLimits) -> ExecutionResult:
        return await self.backend.run(
            program, task.tests, limits, task.entry_point, task.helpers, task.hidden_tests
        )
