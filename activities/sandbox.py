"""The `execute` activity (queue `sandbox`): run every sample's program against the task's tests.

For each item the program is read from the object store (`item.code`), run in the configured
sandbox backend with the request's tests and hidden tests (whose failures are never shown), the
task's helpers (trusted code, run beside the tests in the verifier's checker), entry point and
limits, and its full `ExecutionResult` plus
stdout/stderr are written under the turn's keys (`keys.attempt_key`: one set per activity
attempt, written create-only, so an orphaned attempt that finishes after its retry can never
change the bytes a returned ref names). Items run concurrently, each program holding one of
the worker's `program_slots` (`settings.sandbox.concurrency` programs at once, for all its
activities: the session activities' steps and checks take theirs from the same slots); the
first item that fails cancels its siblings (`activities.heartbeat.heartbeating_each`).

What the program does is a result (passed/failed/error/timeout/memory_exceeded); a platform
fault (`SandboxInfraError`) or an S3 failure raises a retryable error and is never an outcome.
A code ref that does not exist, or a program + tests too large for the backend to carry
(`JobTooLarge`), raises a non-retryable ApplicationError naming the item; hidden tests that break
`hidden_tests_problem`'s rule (which `judge.split_tests` refuses with a ValueError) one naming
`hidden_tests`, before any program runs (a task is checked where it starts, within
`CHECKED_TESTS_CHARS`: one started before that check, or past it, reaches here).

Served by `tempered worker sandbox` (workers/sandbox.py).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import activity

from activities.heartbeat import heartbeating_each
from contracts.errors import ErrorType, fail, invalid
from contracts.names import Activity
from contracts.sandbox import (
    ExecuteItem,
    ExecuteOutcome,
    ExecuteRequest,
    ExecuteResponse,
    ExecutionResult,
)
from contracts.task_tests import hidden_tests_problem
from infra import keys
from infra.circuit import CircuitBreaker, CircuitOpenError, CircuitState
from infra.sandbox import SandboxBackend, SandboxInfraError, get_backend
from infra.sandbox.base import JobTooLarge
from infra.settings import Settings
from infra.storage import ObjectNotFound, ObjectStore
from infra.telemetry import (
    record_circuit_state,
    record_queue_wait,
    record_sandbox_run,
    sandbox_in_flight,
    span,
)

PROBE_POLL_S = 0.1
"""How often an item waiting for a half-open breaker's probe looks at the breaker again."""


def program_slots(settings: Settings) -> asyncio.Semaphore:
    """A worker's limit on the sandboxed programs it runs at once: `sandbox.concurrency`, one
    for the whole worker (workers/sandbox.py hands it to each of its activity classes; one of
    their own each let a worker run twice the setting)."""
    return asyncio.Semaphore(settings.sandbox.concurrency)


class SandboxActivities:
    """Activities of the sandbox queue; holds the backend and the object store."""

    def __init__(
        self,
        settings: Settings,
        store: ObjectStore | None = None,
        backend: SandboxBackend | None = None,
        slots: asyncio.Semaphore | None = None,
    ) -> None:
        """`slots`: the worker's `program_slots`, shared with its session activities (made
        here when not given)."""
        self.settings = settings
        self.store = store if store is not None else ObjectStore.from_settings(settings)
        self.backend = backend if backend is not None else get_backend(settings)
        self._slots = slots if slots is not None else program_slots(settings)
        name = self.backend.name
        self.breaker = CircuitBreaker(
            name, on_change=lambda state: record_circuit_state(name, state)
        )

    @activity.defn(name=Activity.EXECUTE)
    async def execute(self, req: ExecuteRequest) -> ExecuteResponse:
        if not req.items:
            raise invalid("items", "nothing to execute")
        if problem := hidden_tests_problem(req.hidden_tests):  # split_tests' ValueError, each try
            raise invalid("hidden_tests", problem)
        record_queue_wait()
        attempt = activity.info().attempt
        outcomes = await heartbeating_each(
            range(len(req.items)),
            lambda index: self._execute_one(req, index, attempt),
            details=lambda: f"{req.task_id} turn {req.turn}: {len(req.items)} items",
        )
        return ExecuteResponse(outcomes=outcomes)

    async def _execute_one(self, req: ExecuteRequest, index: int, attempt: int) -> ExecuteOutcome:
        item = req.items[index]
        try:
            program = await asyncio.to_thread(self.store.get_text, item.code.key)
        except ObjectNotFound as exc:
            raise invalid(f"items[{index}].code", f"no object at {item.code.key}") from exc
        backend = self.backend.name
        async with self._slots:
            with (
                span(
                    "sandbox.run",
                    task_id=req.task_id,
                    sample=item.sample,
                    turn=req.turn,
                    sandbox_backend=backend,
                ),
                sandbox_in_flight(backend),
            ):
                result = await self._run_guarded(req, item, program)
        record_sandbox_run(backend, result.status.value, result.duration_ms / 1000)

        def key(name: str) -> str:
            return keys.attempt_key(req.run_id, req.task_id, item.sample, req.turn, attempt, name)

        ref = await asyncio.to_thread(
            self.store.put_json, key("result.json"), result, create_only=True
        )
        for name, text in (("stdout.txt", result.stdout), ("stderr.txt", result.stderr)):
            await asyncio.to_thread(self.store.put_text, key(name), text, create_only=True)
        return ExecuteOutcome(
            sample=item.sample,
            status=result.status,
            tests_passed=result.tests_passed,
            tests_total=result.tests_total,
            duration_ms=result.duration_ms,
            result=ref,
        )

    async def _run_guarded(
        self, req: ExecuteRequest, item: ExecuteItem, program: str
    ) -> ExecutionResult:
        """Run through the circuit breaker: a backend failing again and again is paused (the
        activity fails fast and Temporal retries after the breaker's backoff). While a half-open
        breaker's probe runs, the other items wait for its verdict: failing them would cancel
        their siblings, the probe among them, and the breaker would stay half-open for good."""
        while True:
            try:
                with self.breaker.guard(failures=(SandboxInfraError,)):
                    return await self.backend.run(
                        program,
                        req.tests,
                        req.limits,
                        req.entry_point,
                        helpers=req.helpers,
                        hidden_tests=req.hidden_tests,
                    )
            except CircuitOpenError as exc:
                if self.breaker.state is CircuitState.HALF_OPEN:
                    await asyncio.sleep(PROBE_POLL_S)
                    continue
                delay = timedelta(seconds=max(exc.retry_after_s, 1.0))
                raise fail(
                    ErrorType.SANDBOX_CIRCUIT_OPEN, str(exc), next_retry_delay=delay
                ) from exc
            except SandboxInfraError as exc:
                raise fail(ErrorType.SANDBOX_INFRA, f"sample {item.sample}: {exc}") from exc
            except JobTooLarge as exc:  # the same on every retry: the request's fault
                raise fail(
                    ErrorType.INVALID_INPUT, f"task {req.task_id} sample {item.sample}: {exc}"
                ) from exc

    async def close(self) -> None:
        await self.backend.close()
