"""Kubernetes sandbox backend: every execution is a locked-down Job in the sandbox namespace.

    backend = KubernetesBackend(settings.sandbox.kubernetes)  # in-cluster, else ~/.kube/config
    result = await backend.run(program, tests, limits, entry_point="add")
    await backend.close()

The Job manifest comes from `kubernetes_job.build_job_manifest` (pure, validated offline).
Here are the API calls, made with the official client (synchronous, so each runs in a
thread): create the Job; wait for its pod to finish — one shared poller lists this worker's
sandbox pods for all runs in flight, so API load does not grow with concurrency; read the
launcher's result line from the pod log; delete the Job (propagation Background). The pod runs
the same two-process verifier as the other backends (`pod_launcher.py`), and the host judges
its report with the same rules (`judge.py`) against its own count of test units.

The Job is deleted when the run ends, when the awaiting task is cancelled, and (for Jobs
labelled with this worker's id, `TEMPERED_WORKER_ID` or the hostname) when the backend first
runs — no leaked pods; `activeDeadlineSeconds` and `ttlSecondsAfterFinished` bound anything
a killed worker leaves. A throttled (429), failing (5xx) or timed-out request is retried a few
times with backoff (Retry-After honoured); a failed pod list is retried by the poller, and only
`POLL_FAILURE_LIMIT` failures in a row fail the runs waiting on it: one bad list call must not
abort every run in flight. What is still failing then, and every other API or transport failure
(refused connection, 403, 409, a pod that never starts, a pod that ends without the launcher's
result line), raises `SandboxInfraError`; only the program's behaviour becomes an
`ExecutionResult`. A job too large for a pod spec raises `JobTooLarge` (the same every time).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from contracts.sandbox import ExecutionResult
from contracts.task import SandboxLimits
from infra.sandbox.base import DEFAULT_LIMITS, SandboxInfraError
from infra.sandbox.judge import expected_units, judge, split_tests
from infra.sandbox.kubernetes_job import (
    CONTAINER,
    JOB_LABEL,
    SANDBOX_LABELS,
    START_GRACE_S,
    WORKER_LABEL,
    JobTooLarge,
    build_job_manifest,
    label_value,
    observed_from_record,
    parse_pod_log,
    sandbox_rlimits,
)
from infra.sandbox.verifier import checker_job
from infra.settings import KubernetesSandboxSettings

__all__ = [
    "SANDBOX_LABELS",
    "JobTooLarge",
    "KubernetesBackend",
    "build_job_manifest",
    "sandbox_rlimits",
]

DEADLINE_SLACK_S = 10
"""How long past the Job's activeDeadlineSeconds we keep waiting before giving up."""
API_ATTEMPTS = 4
"""Tries of one API call that is throttled, fails with a 5xx or times out."""
RETRY_AFTER_MAX_S = 30.0
"""The longest Retry-After we honour; a server asking for more gets this much."""
POLL_FAILURE_LIMIT = 8
"""Pod lists failing in a row (backing off up to POLL_BACKOFF_MAX_S) before the waiting runs
fail: about half a minute of an API server that answers nothing, not one throttled call."""
POLL_BACKOFF_MAX_S = 5.0
"""The longest wait between two pod lists after failures (the interval doubles per failure)."""
logger = logging.getLogger(__name__)
T = TypeVar("T")


class KubernetesBackend:
    """Runs each program as a Job; `api_client` lets tests point it at a stub API server."""

    name = "kubernetes"

    def __init__(
        self,
        config: KubernetesSandboxSettings | None = None,
        api_client: Any | None = None,
        worker_id: str | None = None,
        poll_interval_s: float = 0.25,
        start_grace_s: int = START_GRACE_S,
        request_timeout_s: float = 30.0,
        deadline_slack_s: float = DEADLINE_SLACK_S,
        retry_wait_s: float = 0.5,
    ) -> None:
        # Imported here: the client costs ~0.25 s, which workers of other backends never need.
        from kubernetes import client
        from kubernetes import config as kube_config

        config = config or KubernetesSandboxSettings()
        self.namespace, self.image = config.namespace, config.image
        self.runtime_class = config.runtime_class
        if api_client is None:
            if os.environ.get("KUBERNETES_SERVICE_HOST"):
                kube_config.load_incluster_config()
            else:
                kube_config.load_kube_config()
            api_client = client.ApiClient()
        self._api_client = api_client
        self._batch, self._core = client.BatchV1Api(api_client), client.CoreV1Api(api_client)
        self._delete_options = client.V1DeleteOptions(propagation_policy="Background")
        self.worker_id = label_value(
            worker_id or os.environ.get("TEMPERED_WORKER_ID") or socket.gethostname()
        )
        self.poll_interval_s, self.start_grace_s = poll_interval_s, start_grace_s
        self.request_timeout_s, self.deadline_slack_s = request_timeout_s, deadline_slack_s
        self.retry_wait_s = retry_wait_s
        self._poll_error: SandboxInfraError | None = None
        self._started = False
        self._start_lock = asyncio.Lock()
        self._waiters: dict[str, asyncio.Future[Any]] = {}
        self._pod_states: dict[str, str] = {}
        self._poller: asyncio.Task[None] | None = None

    async def _call(
        self,
        what: str,
        fn: Callable[..., T],
        *args: Any,
        attempts: int = API_ATTEMPTS,
        **kwargs: Any,
    ) -> T:
        """Run one client call in a thread, retrying throttling, 5xx and timeouts (`attempts`
        tries); every API/transport failure left is a SandboxInfraError."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        kwargs.setdefault("_request_timeout", self.request_timeout_s)

        def wait(state: RetryCallState) -> float:
            backoff = self.retry_wait_s * 2 ** (state.attempt_number - 1)
            error = state.outcome.exception() if state.outcome else None
            return _retry_after(error) or backoff

        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(attempts),
                wait=wait,
                retry=retry_if_exception(_transient),
                reraise=True,
            ):
                with attempt:
                    return await asyncio.to_thread(fn, *args, **kwargs)
        except ApiException as error:
            raise SandboxInfraError(
                f"kubernetes {what}: HTTP {error.status} {error.reason}"
            ) from error
        except (HTTPError, OSError, ValueError) as error:  # ValueError: a malformed response
            raise SandboxInfraError(
                f"kubernetes {what}: {type(error).__name__}: {error}"
            ) from error
        raise AssertionError("unreachable: tenacity returns or raises")

    async def reap(self) -> int:
        """Delete every Job labelled with this worker's id (left over by a previous process)."""
        selector = f"{WORKER_LABEL}={self.worker_id}"
        jobs = await self._call(
            "list jobs", self._batch.list_namespaced_job, self.namespace, label_selector=selector
        )
        for job in jobs.items:
            await self._delete(str(job.metadata.name if job.metadata else ""))
        return len(jobs.items)

    async def run(
        self,
        program: str,
        tests: str = "",
        limits: SandboxLimits = DEFAULT_LIMITS,
        entry_point: str | None = None,
        helpers: str = "",
    ) -> ExecutionResult:
        async with self._start_lock:
            if not self._started:
                await self.reap()
                self._started = True
        name = f"tempered-sbx-{secrets.token_hex(6)}"
        nonce = secrets.token_hex(16)
        units = split_tests(tests, entry_point)
        rlimits = sandbox_rlimits(limits)
        job = checker_job(program, tests, helpers, units, entry_point, limits, rlimits)
        manifest = build_job_manifest(
            name,
            self.namespace,
            self.image,
            job,
            limits,
            nonce,
            self.worker_id,
            self.runtime_class,
            start_grace_s=self.start_grace_s,
        )
        try:  # the Job is deleted however this ends: result, API error or cancellation
            await self._create(manifest)
            deadline = (
                time.monotonic() + limits.timeout_s + self.start_grace_s + self.deadline_slack_s
            )
            pod = await self._wait_for_pod(name, deadline)
            pod_log = await self._call(
                "read log",
                self._core.read_namespaced_pod_log,
                pod.metadata.name,
                self.namespace,
                container=CONTAINER,
            )
        finally:
            await asyncio.shield(self._delete_quietly(name))
        record = parse_pod_log(pod_log, nonce)
        if record is None:
            raise SandboxInfraError(
                f"kubernetes pod {pod.metadata.name} ended without a result "
                f"({_terminated_reason(pod)})"
            )
        if record.get("fault"):
            raise SandboxInfraError(f"kubernetes pod {pod.metadata.name}: {record['fault']}")
        seen = observed_from_record(record, limits)
        return judge(seen, expected_units(units, entry_point), limits, self.name, "kubernetes")

    async def _create(self, manifest: dict[str, Any]) -> None:
        """Create the Job. A retried create (the first timed out or got a 5xx after the server
        stored it) may find it there: its name is this run's alone, so a 409 then is success."""
        from kubernetes.client.exceptions import ApiException

        tries, body = 0, cast(Any, manifest)  # the client takes the dict as it is

        def create(**kwargs: Any) -> object:
            nonlocal tries
            tries += 1
            try:
                return self._batch.create_namespaced_job(self.namespace, body, **kwargs)
            except ApiException as error:
                if error.status == 409 and tries > 1:
                    return None
                raise

        await self._call("create job", create)

    async def _wait_for_pod(self, job_name: str, deadline: float) -> Any:
        """The Job's pod once it succeeded or failed; SandboxInfraError if it never gets there."""
        waiter: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiters[job_name] = waiter
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll_pods())
        try:
            return await asyncio.wait_for(waiter, timeout=max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            state = self._pod_states.get(job_name, "no pod yet")
            if self._poll_error is not None:
                state += f"; last pod list: {self._poll_error}"
            raise SandboxInfraError(
                f"kubernetes job {job_name} did not finish in time ({state})"
            ) from None
        finally:
            self._waiters.pop(job_name, None)
            self._pod_states.pop(job_name, None)

    async def _poll_pods(self) -> None:
        """One list call per interval serves every run in flight; stops when none waits. A
        failed list is logged and retried with backoff: the pods run on meanwhile, so only
        POLL_FAILURE_LIMIT failures in a row fail the waiting runs (each also has its deadline)."""
        selector = f"{WORKER_LABEL}={self.worker_id}"
        failures = 0
        while self._waiters:
            try:
                pods = await self._call(
                    "list pods",
                    self._core.list_namespaced_pod,
                    self.namespace,
                    attempts=1,  # this loop is the retry, with the waiters' state kept
                    label_selector=selector,
                )
            except SandboxInfraError as error:
                failures += 1
                self._poll_error = error
                logger.warning("sandbox pod poll failed (%d in a row): %s", failures, error)
                if failures >= POLL_FAILURE_LIMIT:
                    failed = SandboxInfraError(f"{error} ({failures} pod lists failed in a row)")
                    for waiter in self._waiters.values():
                        if not waiter.done():
                            waiter.set_exception(failed)
                    failures = 0
                delay = self.poll_interval_s * 2 ** min(failures, 10)
                await asyncio.sleep(min(delay, max(POLL_BACKOFF_MAX_S, self.poll_interval_s)))
                continue
            failures, self._poll_error = 0, None
            for pod in pods.items:
                job_name = (pod.metadata.labels or {}).get(JOB_LABEL) if pod.metadata else None
                pending = self._waiters.get(job_name or "")
                if pending is None or pending.done():
                    continue
                if pod.status and pod.status.phase in ("Succeeded", "Failed"):
                    pending.set_result(pod)
                else:
                    self._pod_states[str(job_name)] = _pod_state(pod)
            await asyncio.sleep(self.poll_interval_s)

    async def _delete(self, job_name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            await self._call(
                "delete job",
                self._batch.delete_namespaced_job,
                job_name,
                self.namespace,
                body=self._delete_options,
            )
        except SandboxInfraError as error:
            if isinstance(error.__cause__, ApiException) and error.__cause__.status == 404:
                return  # already gone (TTL controller or a concurrent reap)
            raise

    async def _delete_quietly(self, job_name: str) -> None:
        """Delete after a run; a failure is logged, the Job's TTL and deadline still bound it."""
        try:
            await self._delete(job_name)
        except SandboxInfraError as error:
            logger.warning("could not delete sandbox job %s: %s", job_name, error)

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        await asyncio.to_thread(self._api_client.close)


def _transient(error: BaseException) -> bool:
    """Worth another try: throttled (429), a server error (5xx) or a timed-out request."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import MaxRetryError, NewConnectionError
    from urllib3.exceptions import TimeoutError as RequestTimeout

    if isinstance(error, ApiException):
        return error.status == 429 or (error.status or 0) >= 500
    if isinstance(error, MaxRetryError):  # urllib3's own retries, spent on a timeout
        error = error.reason or error
    # urllib3 makes a refused connection a connect timeout; its own retries cover those
    return isinstance(error, RequestTimeout) and not isinstance(error, NewConnectionError)


def _retry_after(error: BaseException | None) -> float | None:
    """Seconds a 429/503's Retry-After header asks for (capped), if it gives a number."""
    headers = getattr(error, "headers", None) or {}
    value = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    try:
        return min(max(float(value), 0.0), RETRY_AFTER_MAX_S) if value is not None else None
    except ValueError:  # an HTTP date: fall back to our own backoff
        return None


def _terminated_reason(pod: Any) -> str:
    for status in (pod.status.container_statuses or []) if pod.status else []:
        if status.state and status.state.terminated:
            return str(
                status.state.terminated.reason or f"exit {status.state.terminated.exit_code}"
            )
    return str(pod.status.reason if pod.status else "unknown")


def _pod_state(pod: Any) -> str:
    phase = pod.status.phase if pod.status else "Unknown"
    for status in (pod.status.container_statuses or []) if pod.status else []:
        if status.state and status.state.waiting:
            return f"{phase}: {status.state.waiting.reason}"
    return str(phase)
