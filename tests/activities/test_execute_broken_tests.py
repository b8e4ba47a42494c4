"""`execute` given hidden tests that break `hidden_tests_problem`'s rule (no top-level assert, or a
`check` nothing calls) fails non-retryable with `InvalidInput` naming `hidden_tests`, with the
real bwrap backend and a real SeaweedFS: the same on every retry, so the request's fault.

A task checked where it starts never sends them (workflows/agent_task.py `TESTS_CHECKED_PATCH`);
one that reaches `execute` another way (a task started before that check, still running) got a
plain ValueError from `judge.split_tests`, retried for ever (`maximum_attempts=0`)."""

from __future__ import annotations

import os
import shutil

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.sandbox import SandboxActivities
from contracts.errors import ErrorType
from contracts.sandbox import ExecStatus
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.activities.test_sandbox import PROGRAMS, request

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.skipif(
        shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bwrap and root"
    ),
]
HIDDEN = {
    "uncalled-check": "def check(candidate):\n    assert candidate(1, 1) == 2\n",
    "no-assert": "def helper():\n    return 1\n",
}


@pytest.mark.parametrize("hidden", sorted(HIDDEN))
async def test_broken_hidden_tests_fail_non_retryable(store: ObjectStore, hidden: str) -> None:
    acts = SandboxActivities(Settings(), store=store)
    try:
        with pytest.raises(ApplicationError) as raised:
            await ActivityEnvironment().run(
                acts.execute, request(store, {0: PROGRAMS[0]}, hidden_tests=HIDDEN[hidden])
            )
    finally:
        await acts.close()
    assert raised.value.type == ErrorType.INVALID_INPUT and raised.value.non_retryable
    assert raised.value.message.startswith("hidden_tests: "), raised.value.message


async def test_good_hidden_tests_still_run(store: ObjectStore) -> None:
    acts = SandboxActivities(Settings(), store=store)
    try:
        response = await ActivityEnvironment().run(
            acts.execute,
            request(
                store, {0: PROGRAMS[0], 1: PROGRAMS[1]}, hidden_tests="assert add(2, 2) == 4\n"
            ),
        )
    finally:
        await acts.close()
    assert [o.status for o in response.outcomes] == [ExecStatus.PASSED, ExecStatus.FAILED]
    assert [o.tests_total for o in response.outcomes] == [2, 2]
