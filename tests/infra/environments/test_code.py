"""The `code` environment: the action is the answer, the observation its test log, and the
score whether the last answer passes (through the real local backend)."""

from __future__ import annotations

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits, TaskSpec
from infra.environments.code import CodeEnvironment
from infra.sandbox.local import LocalBackend
from tests.infra.environments.conftest import needs_root

pytestmark = [needs_root, pytest.mark.asyncio]
TASK = TaskSpec(
    id="add",
    prompt="Write add(a, b).",
    entry_point="add",
    tests="def check(candidate):\n    assert candidate(2, 3) == 5\n",
)


async def test_answers_are_run_against_the_tests() -> None:
    backend = LocalBackend(warm=0)
    env = CodeEnvironment(backend)
    try:
        state = await env.reset(TASK, "s0")
        state, seen = await env.step(state, "def add(a, b):\n    return a - b\n", SandboxLimits())
        assert seen.status is ExecStatus.FAILED and not seen.submitted
        assert seen.text.startswith("status: failed (0/1 tests)") and "AssertionError" in seen.text
        state, seen = await env.step(state, "def add(a, b):\n    return a + b\n", SandboxLimits())
        assert seen.submitted and env.tools == ()
        graded = await env.verify(TASK, state, SandboxLimits())
        assert graded.score == 1.0 and graded.result.status is ExecStatus.PASSED
        assert await env.close(["s0"]) == 0
    finally:
        await backend.close()
