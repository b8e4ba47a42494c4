"""One call of the Kubernetes sandbox backend (`kubernetes.py`) to the API server: run in a
thread (the official client is synchronous), retried while another try may pass, and every
failure left a `SandboxInfraError` that names the call.

    jobs = await call("list jobs", batch.list_namespaced_job, namespace, label_selector=selector)

A throttled (429), failing (5xx) or timed-out request (`kubernetes_job.transient`) is tried up
to `attempts` times, waiting `retry_wait_s` doubled per try, or what the server's Retry-After
asks (capped: `kubernetes_job.retry_after`). Anything else fails at once: a refused connection
(urllib3's own retries covered it), a 403, a 404, a 409, a malformed response. Each request is
bounded by `request_timeout_s` unless the call passes its own `_request_timeout`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from infra.sandbox.base import SandboxInfraError
from infra.sandbox.kubernetes_job import retry_after, transient

API_ATTEMPTS = 4
"""Tries of one API call that is throttled, fails with a 5xx or times out."""
T = TypeVar("T")


async def call(
    what: str,
    fn: Callable[..., T],
    *args: Any,
    attempts: int = API_ATTEMPTS,
    retry_wait_s: float = 0.5,
    request_timeout_s: float = 30.0,
    **kwargs: Any,
) -> T:
    """`fn(*args, **kwargs)` in a thread, retrying throttling, 5xx and timeouts (`attempts`
    tries); every API/transport failure left is a SandboxInfraError saying `what` failed."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    kwargs.setdefault("_request_timeout", request_timeout_s)

    def wait(state: RetryCallState) -> float:
        backoff = retry_wait_s * 2 ** (state.attempt_number - 1)
        error = state.outcome.exception() if state.outcome else None
        return retry_after(error) or backoff

    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(attempts),
            wait=wait,
            retry=retry_if_exception(transient),
            reraise=True,
        ):
            with attempt:
                return await asyncio.to_thread(fn, *args, **kwargs)
    except ApiException as error:
        raise SandboxInfraError(f"kubernetes {what}: HTTP {error.status} {error.reason}") from error
    except (HTTPError, OSError, ValueError) as error:  # ValueError: a malformed response
        raise SandboxInfraError(f"kubernetes {what}: {type(error).__name__}: {error}") from error
    raise AssertionError("unreachable: tenacity returns or raises")
