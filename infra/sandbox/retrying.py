"""One program through a sandbox backend, with platform failures retried: for offline paths.

Activities leave retries to Temporal. `tempered tasks validate` and `tempered regrade` call a
backend directly, so they retry here, with the same backoff (`contracts.errors.INFRA_RETRY`)
for at most `offline_attempts`. A platform failure (`SandboxInfraError`, or status
`infra_error`) is never a verdict: after the last attempt the run is reported as unjudged.

    outcome = await run_retrying(backend, program, task.tests, limits, task.entry_point,
                                 helpers=task.helpers, hidden_tests=task.hidden_tests)
    if outcome.result is None: ...          # every attempt hit the platform, not the program
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential,
)

from contracts.errors import INFRA_RETRY, Backoff
from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import SandboxLimits
from infra.sandbox.base import SandboxBackend, SandboxInfraError


def offline_retrying(
    fault: type[BaseException], backoff: Backoff = INFRA_RETRY, **options: Any
) -> AsyncRetrying:
    """Tenacity's retrying of `fault` with the offline paths' backoff (at most
    `backoff.offline_attempts` attempts); `options` go to `AsyncRetrying` (e.g. before_sleep)."""
    return AsyncRetrying(
        stop=stop_after_attempt(backoff.offline_attempts),
        wait=wait_exponential(
            multiplier=backoff.initial_s, exp_base=backoff.coefficient, max=backoff.max_s
        ),
        retry=retry_if_exception_type(fault),
        **options,
    )


@dataclass(frozen=True)
class Attempted:
    """The result of the first attempt the platform did not fail (None if none), and why not."""

    result: ExecutionResult | None
    infra_retries: int
    detail: str = ""


class _PlatformFault(Exception):
    pass


async def run_retrying(
    backend: SandboxBackend,
    program: str,
    tests: str,
    limits: SandboxLimits,
    entry_point: str | None,
    *,
    helpers: str = "",
    hidden_tests: str = "",
    gate: asyncio.Semaphore | None = None,
    backoff: Backoff = INFRA_RETRY,
) -> Attempted:
    """Run `program` against `tests` and `hidden_tests` (with the task's `helpers`), retrying
    platform failures; `gate` bounds concurrency."""
    gate = gate or asyncio.Semaphore(1)
    failures: list[str] = []

    async def attempt() -> ExecutionResult:
        async with gate:
            try:
                result = await backend.run(
                    program, tests, limits, entry_point, helpers=helpers, hidden_tests=hidden_tests
                )
            except SandboxInfraError as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                raise _PlatformFault from exc
        if result.status == ExecStatus.INFRA_ERROR:
            failures.append(result.detail or "infra_error")
            raise _PlatformFault
        return result

    try:
        result: ExecutionResult = await offline_retrying(_PlatformFault, backoff)(attempt)
    except RetryError:
        return Attempted(None, len(failures) - 1, failures[-1] if failures else "")
    return Attempted(result, len(failures))
