"""Two live attempts of one `execute` (a retry after a heartbeat timeout while the first attempt
still runs) never leave a ref whose bytes changed; a failing item cancels its siblings."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import time

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.sandbox import SandboxActivities
from contracts.errors import ErrorType
from contracts.sandbox import ExecStatus, ExecuteItem, ExecuteRequest, ExecutionResult
from contracts.task import SandboxLimits
from infra import keys
from infra.sandbox.base import DEFAULT_LIMITS, SandboxInfraError
from infra.settings import Settings
from infra.storage import ObjectStore

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bwrap and root"
)

RUN, TASK = "run-attempts", "add"
TESTS = "def check(candidate):\n    assert candidate(1, 2) == 3\n"
SLOW_IF_FIRST = (
    "import os, time\ndef add(a, b):\n    return a + b\nprint('attempt output', flush=True)\n"
)


def environment(attempt: int) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=attempt)
    return env


def request(store: ObjectStore, programs: list[str]) -> ExecuteRequest:
    items = [
        ExecuteItem(sample=s, code=store.put_text(keys.turn_key(RUN, TASK, s, 0, "code.py"), p))
        for s, p in enumerate(programs)
    ]
    return ExecuteRequest(
        run_id=RUN,
        task_id=TASK,
        turn=0,
        tests=TESTS,
        entry_point="add",
        limits=SandboxLimits(timeout_s=8),
        items=items,
    )


class DelayedBackend:
    """The real local backend, with attempt 1's results held back until attempt 2 is done, as
    when a worker stalls past its heartbeat timeout and the server starts a retry elsewhere."""

    def __init__(self, inner: object, gate: asyncio.Event, first_attempt_stdout: str) -> None:
        self.inner, self.gate, self.marker = inner, gate, first_attempt_stdout
        self.name = "local"

    async def run(
        self,
        program: str,
        tests: str = "",
        limits: SandboxLimits = DEFAULT_LIMITS,
        entry_point: str | None = None,
        helpers: str = "",
        hidden_tests: str = "",
    ) -> ExecutionResult:
        run = self.inner.run  # type: ignore[attr-defined]
        result: ExecutionResult = await run(
            program, tests, limits, entry_point, helpers, hidden_tests
        )
        if "slow attempt" in program:
            await self.gate.wait()
            return result.model_copy(update={"stdout": self.marker})
        return result

    async def close(self) -> None:
        await self.inner.close()  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_orphaned_attempt_never_changes_a_returned_ref(store: ObjectStore) -> None:
    real = SandboxActivities(Settings(), store=store)
    gate = asyncio.Event()
    slow = SandboxActivities(
        Settings(), store=store, backend=DelayedBackend(real.backend, gate, "late\n")
    )
    slow_request = request(store, [SLOW_IF_FIRST.replace("os, time", "os, time  # slow attempt")])
    first = asyncio.create_task(environment(1).run(slow.execute, slow_request))
    await asyncio.sleep(0.5)
    retry_request = request(store, [SLOW_IF_FIRST])  # same item, a fresh attempt
    second = await environment(2).run(real.execute, retry_request)
    gate.set()  # the orphaned first attempt finishes only now, and writes its own results
    orphan = await first
    await real.close()
    for response, attempt in ((second, 2), (orphan, 1)):
        [outcome] = response.outcomes
        assert outcome.status == ExecStatus.PASSED
        assert outcome.result.key == keys.attempt_key(RUN, TASK, 0, 0, attempt, "result.json")
        assert store.get_verified(outcome.result)  # bytes still match the returned digest
    assert store.get_text(keys.attempt_key(RUN, TASK, 0, 0, 2, "stdout.txt")) == "attempt output\n"
    assert store.get_text(keys.attempt_key(RUN, TASK, 0, 0, 1, "stdout.txt")) == "late\n"


class FailingOnSecond:
    """Item 1 hits a platform fault while item 0, which would run for 30 s, is running."""

    name = "local"

    def __init__(self) -> None:
        self.cancelled = False
        self.sibling_running = asyncio.Event()

    async def run(
        self,
        program: str,
        tests: str = "",
        limits: SandboxLimits = DEFAULT_LIMITS,
        entry_point: str | None = None,
        helpers: str = "",
        hidden_tests: str = "",
    ) -> ExecutionResult:
        if "fault" in program:
            await self.sibling_running.wait()  # fail while the other item is mid-run
            raise SandboxInfraError("injected platform fault")
        self.sibling_running.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        raise AssertionError("the sibling should have been cancelled")

    async def close(self) -> None:
        pass


@pytest.mark.asyncio
async def test_failing_item_cancels_its_siblings(store: ObjectStore) -> None:
    backend = FailingOnSecond()
    acts = SandboxActivities(Settings(), store=store, backend=backend)  # type: ignore[arg-type]
    started = time.monotonic()
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(acts.execute, request(store, ["x = 1\n", "# fault\n"]))
    assert caught.value.type == ErrorType.SANDBOX_INFRA and not caught.value.non_retryable
    assert backend.cancelled and time.monotonic() - started < 10
