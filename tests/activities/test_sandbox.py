"""The execute activity with real bwrap and a real SeaweedFS: results stored, statuses mapped,
items run concurrently, platform faults retryable, bad input not."""

from __future__ import annotations

import asyncio
import os
import shutil
import time

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.sandbox import SandboxActivities
from contracts.sandbox import ExecStatus, ExecuteItem, ExecuteRequest, ExecutionResult
from contracts.task import SandboxLimits
from infra import keys
from infra.circuit import CircuitBreaker, CircuitConfig, CircuitState
from infra.sandbox.local import LocalBackend
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.activities.heartbeats import timing_out_after

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bwrap and root"
)

RUN, TASK = "run-sbx", "add"
TESTS = "def check(candidate):\n    assert candidate(1, 2) == 3\n"
PROGRAMS = {
    0: "def add(a, b):\n    return a + b\nprint('solved')\n",
    1: "def add(a, b):\n    return a - b\n",
    2: "import time\ntime.sleep(1.5)\ndef add(a, b):\n    return a + b\n",
    3: "def add(a, b):\n    return a + b\nimport sys\nsys.exit(0)\n",
}


def request(store: ObjectStore, programs: dict[int, str], **overrides: object) -> ExecuteRequest:
    items = [
        ExecuteItem(sample=s, code=store.put_text(keys.turn_key(RUN, TASK, s, 0, "code.py"), code))
        for s, code in programs.items()
    ]
    fields = {
        "run_id": RUN,
        "task_id": TASK,
        "turn": 0,
        "tests": TESTS,
        "entry_point": "add",
        "limits": SandboxLimits(timeout_s=8),
        "items": items,
    } | overrides
    return ExecuteRequest(**fields)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_execute_stores_results_and_maps_statuses(store: ObjectStore) -> None:
    acts = SandboxActivities(Settings(), store=store)
    heartbeats: list[object] = []
    env = timing_out_after(0.03)
    env.on_heartbeat = lambda *details: heartbeats.append(details)
    started = time.monotonic()
    try:
        response = await env.run(
            acts.execute, request(store, {0: PROGRAMS[0], 1: PROGRAMS[1], 3: PROGRAMS[3]})
        )
    finally:
        await acts.close()
    assert [o.sample for o in response.outcomes] == [0, 1, 3]
    assert [o.status for o in response.outcomes] == [
        ExecStatus.PASSED,
        ExecStatus.FAILED,
        ExecStatus.FAILED,
    ]
    assert [(o.tests_passed, o.tests_total) for o in response.outcomes] == [(1, 1), (0, 1), (0, 1)]
    solved = response.outcomes[0]
    assert solved.result.key == keys.attempt_key(RUN, TASK, 0, 0, 1, "result.json")
    stored = store.get_model(solved.result.key, ExecutionResult)
    assert stored.status == ExecStatus.PASSED and stored.backend == "local"
    assert store.get_text(keys.attempt_key(RUN, TASK, 0, 0, 1, "stdout.txt")) == "solved\n"
    assert "AssertionError" in store.get_text(keys.attempt_key(RUN, TASK, 1, 0, 1, "stderr.txt"))
    assert heartbeats and time.monotonic() - started < 30


@pytest.mark.asyncio
async def test_items_run_concurrently(store: ObjectStore) -> None:
    acts = SandboxActivities(Settings(sandbox={"concurrency": 4}), store=store)
    started = time.monotonic()
    try:
        response = await ActivityEnvironment().run(
            acts.execute, request(store, {s: PROGRAMS[2] for s in range(4)})
        )
        elapsed = time.monotonic() - started
    finally:
        await acts.close()
    assert all(o.status == ExecStatus.PASSED for o in response.outcomes)
    assert elapsed < 4 * 1.5, f"4 programs sleeping 1.5 s each took {elapsed:.1f} s: not concurrent"


@pytest.mark.asyncio
async def test_platform_fault_is_a_retryable_error(store: ObjectStore) -> None:
    backend = LocalBackend()
    backend.verifier.bwrap = None
    acts = SandboxActivities(Settings(), store=store, backend=backend)
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(acts.execute, request(store, {0: PROGRAMS[0]}))
    assert caught.value.type == "SandboxInfraError" and not caught.value.non_retryable
    assert not list(store.list_keys(keys.turn_prefix(RUN, TASK, 0, 0) + "attempt-"))


@pytest.mark.asyncio
async def test_items_wait_for_a_half_open_breakers_probe(store: ObjectStore) -> None:
    """The platform is back after the breaker opened: the first item of the next attempt is
    the probe, and its siblings, refused while it ran, failed the attempt and cancelled the
    probe, so the breaker stayed half-open for every attempt with more than one item."""
    backend = LocalBackend()
    bwrap, backend.verifier.bwrap = backend.verifier.bwrap, None  # the platform fails
    acts = SandboxActivities(Settings(sandbox={"concurrency": 4}), store=store, backend=backend)
    acts.breaker = CircuitBreaker(
        "local", CircuitConfig(consecutive_failures=1, base_backoff_s=0.1)
    )
    env = ActivityEnvironment()
    try:
        with pytest.raises(ApplicationError, match="bwrap"):
            await env.run(acts.execute, request(store, {0: PROGRAMS[0]}))
        assert acts.breaker.state is CircuitState.OPEN
        backend.verifier.bwrap = bwrap  # back
        await asyncio.sleep(0.2)  # the backoff has passed: half-open
        response = await env.run(acts.execute, request(store, {s: PROGRAMS[0] for s in range(4)}))
    finally:
        await acts.close()
    assert [o.status for o in response.outcomes] == [ExecStatus.PASSED] * 4
    assert acts.breaker.state is CircuitState.CLOSED


@pytest.mark.asyncio
async def test_the_tasks_helpers_reach_the_checker(store: ObjectStore) -> None:
    helpers = "def double(x):\n    return 2 * x\n"  # the task's: the program's copy is ignored
    add = "def add(a, b):\n    return a + b\n"
    programs = {0: add, 1: add + "def double(x):\n    return 3\n", 2: add.replace("+", "*")}
    tests = "assert double(add(1, 2)) == 6\n"
    acts = SandboxActivities(Settings(), store=store)
    try:
        req = request(store, programs, tests=tests, entry_point=None, helpers=helpers)
        response = await ActivityEnvironment().run(acts.execute, req)
    finally:
        await acts.close()
    statuses = [o.status for o in response.outcomes]
    assert statuses == [ExecStatus.PASSED, ExecStatus.PASSED, ExecStatus.FAILED]


@pytest.mark.asyncio
async def test_the_tasks_hidden_tests_count_and_their_failures_stay_hidden(
    store: ObjectStore,
) -> None:
    programs = {0: PROGRAMS[0], 1: "def add(a, b):\n    return 3 if (a, b) == (1, 2) else 0\n"}
    acts = SandboxActivities(Settings(), store=store)
    try:
        req = request(store, programs, hidden_tests="assert add(40, 2) == 42\n")
        response = await ActivityEnvironment().run(acts.execute, req)
    finally:
        await acts.close()
    solved, special_cased = response.outcomes
    assert (solved.status, solved.tests_passed, solved.tests_total) == (ExecStatus.PASSED, 2, 2)
    assert special_cased.status == ExecStatus.FAILED and special_cased.tests_passed == 1
    stderr = store.get_text(special_cased.result.key.replace("result.json", "stderr.txt"))
    assert stderr == "a hidden test failed (AssertionError)\n"


@pytest.mark.asyncio
async def test_missing_code_is_invalid_input(store: ObjectStore) -> None:
    acts = SandboxActivities(Settings(), store=store)
    req = request(store, {0: PROGRAMS[0]})
    req.items[0].code.key = "runs/nowhere/code.py"
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(acts.execute, req)
    await acts.close()
    assert caught.value.non_retryable and "items[0].code" in str(caught.value)
