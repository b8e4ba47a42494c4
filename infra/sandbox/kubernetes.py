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
runs. A replaced worker pod (deleted, evicted, crashed: its successor has a new name) leaves
Jobs no one awaits: its fellow workers delete them (`reap_orphans`, in the background with the
first run, then at most every `REAP_EVERY_S` while runs come) once its pod, in the namespace
its Jobs name (`WORKER_NAMESPACE_LABEL`, set only where the worker id is a pod's name), is not
found or has ended; a pod that exists, or a failed lookup, keeps them. `activeDeadlineSeconds`
and `ttlSecondsAfterFinished` bound whatever is left. `kubernetes_job.PERMISSIONS` lists
every call made here, as the RBAC rules the chart grants.

A throttled (429), failing (5xx) or timed-out request is retried a few times with backoff
(Retry-After honoured: `kubernetes_api.call`); a failed pod list is retried by the poller, and
only `POLL_FAILURE_LIMIT` failures in a row fail the runs waiting on it: one bad list call must
not abort every run in flight. What is still failing then, and every other API or transport failure
(refused connection, 403, 409, a pod that never starts, a pod that ends without the launcher's
result line), raises `SandboxInfraError`; only the program's behaviour becomes an
`ExecutionResult`. A job too large for a pod spec raises `JobTooLarge` (the same every time).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import Callable
from typing import Any, TypeVar, cast

from contracts.sandbox import ExecutionResult
from contracts.task import SandboxLimits
from infra.sandbox.base import DEFAULT_LIMITS, SandboxInfraError
from infra.sandbox.judge import expected_units, judge, split_tests
from infra.sandbox.kubernetes_api import API_ATTEMPTS, call
from infra.sandbox.kubernetes_job import (
    CONTAINER,
    JOB_LABEL,
    SANDBOX_LABELS,
    START_GRACE_S,
    WORKER_LABEL,
    WORKER_NAMESPACE_LABEL,
    JobTooLarge,
    build_job_manifest,
    jobs_by_worker,
    label_value,
    not_found,
    observed_from_record,
    parse_pod_log,
    pod_ended,
    pod_namespace,
    pod_state,
    sandbox_rlimits,
    terminated_reason,
)
from infra.sandbox.verifier import checker_job
from infra.settings import KubernetesSandboxSettings

__all__ = [
    "API_ATTEMPTS",
    "SANDBOX_LABELS",
    "JobTooLarge",
    "KubernetesBackend",
    "build_job_manifest",
    "sandbox_rlimits",
]

DEADLINE_SLACK_S = 10
"""How long past the Job's activeDeadlineSeconds we keep waiting before giving up."""
POLL_FAILURE_LIMIT = 8
"""Pod lists failing in a row (backing off up to POLL_BACKOFF_MAX_S) before the waiting runs
fail: about half a minute of an API server that answers nothing, not one throttled call."""
POLL_BACKOFF_MAX_S = 5.0
"""The longest wait between two pod lists after failures (the interval doubles per failure)."""
REAP_EVERY_S = 60.0
"""Least time between two sweeps for the Jobs of gone workers (one starts with a run)."""
REAP_WORKERS_MAX = 16
"""Worker pods one sweep looks up (drawn at random, so none waits for ever): bounds its calls."""
REAP_JOBS_MAX = 500
"""Jobs one sweep lists (the namespace's quota holds far fewer)."""
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
        worker_namespace: str | None = None,
        reap_every_s: float = REAP_EVERY_S,
    ) -> None:
        """`worker_namespace`: the namespace of this worker's pod, whose name is `worker_id`
        (default: `pod_namespace`'s answer; None: no fellow workers, no sweeps)."""
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
        worker = worker_id or os.environ.get("TEMPERED_WORKER_ID") or socket.gethostname()
        self.worker_id = label_value(worker)
        self.worker_namespace = worker_namespace or pod_namespace(worker)
        self.reap_every_s, self._next_sweep = reap_every_s, 0.0
        self._sweeper: asyncio.Task[None] | None = None
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
        self, what: str, fn: Callable[..., T], *args: Any, attempts: int = API_ATTEMPTS,
        **kwargs: Any,
    ) -> T:  # fmt: skip
        """One client call (`kubernetes_api.call`) with this backend's timeout and backoff."""
        return await call(
            what, fn, *args, attempts=attempts, retry_wait_s=self.retry_wait_s,
            request_timeout_s=self.request_timeout_s, **kwargs,
        )  # fmt: skip

    async def reap(self) -> int:
        """Delete every Job labelled with this worker's id (left over by a previous process)."""
        selector = f"{WORKER_LABEL}={self.worker_id}"
        jobs = await self._call(
            "list jobs", self._batch.list_namespaced_job, self.namespace, label_selector=selector
        )
        for job in jobs.items:
            await self._delete(str(job.metadata.name if job.metadata else ""))
        return len(jobs.items)

    async def reap_orphans(self) -> int:
        """Delete the Jobs of this worker's fellow workers (same pod namespace) whose pod is
        gone: none by that name, or one that ended. Returns how many it deleted. Idempotent
        (a Job already gone is no error); at most REAP_WORKERS_MAX pods looked up."""
        if self.worker_namespace is None:
            return 0
        selector = f"{WORKER_NAMESPACE_LABEL}={self.worker_namespace}"
        jobs = await self._call(
            "list jobs", self._batch.list_namespaced_job, self.namespace,
            label_selector=selector, limit=REAP_JOBS_MAX,
        )  # fmt: skip
        workers = jobs_by_worker(jobs.items, skip=self.worker_id)
        deleted = 0
        for worker in random.sample(list(workers), min(len(workers), REAP_WORKERS_MAX)):
            if await self._worker_gone(worker, self.worker_namespace):
                for name in (names := workers[worker]):
                    await self._delete(name)
                logger.info("deleted the %d Jobs of worker %s: it is gone", len(names), worker)
                deleted += len(names)
        return deleted

    async def _worker_gone(self, worker: str, namespace: str) -> bool:
        """Whether `worker`'s pod is gone; a lookup that fails (but for a 404) says no."""
        try:
            pod = await self._call(
                "get worker pod", self._core.read_namespaced_pod, worker, namespace
            )
        except SandboxInfraError as error:
            if not_found(error):
                return True
            logger.warning("keeping the sandbox Jobs of worker %s: %s", worker, error)
            return False
        return pod_ended(pod)

    async def _sweep(self) -> None:
        """One `reap_orphans` in the background: a failure is logged, and the next sweep (in
        reap_every_s, with a run) tries again."""
        try:
            await self.reap_orphans()
        except SandboxInfraError as error:
            logger.warning("sweep for the Jobs of gone sandbox workers failed: %s", error)

    async def run(
        self,
        program: str,
        tests: str = "",
        limits: SandboxLimits = DEFAULT_LIMITS,
        entry_point: str | None = None,
        helpers: str = "",
        hidden_tests: str = "",
    ) -> ExecutionResult:
        async with self._start_lock:
            if not self._started:
                await self.reap()
                self._started = True
            due = self.worker_namespace and time.monotonic() >= self._next_sweep
            if due and (self._sweeper is None or self._sweeper.done()):
                self._next_sweep = time.monotonic() + self.reap_every_s
                self._sweeper = asyncio.create_task(self._sweep())
        name = f"tempered-sbx-{secrets.token_hex(6)}"
        nonce = secrets.token_hex(16)
        units = split_tests(tests, entry_point, hidden_tests)
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
            worker_namespace=self.worker_namespace,
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
                f"({terminated_reason(pod)})"
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
                    self._pod_states[str(job_name)] = pod_state(pod)
            await asyncio.sleep(self.poll_interval_s)

    async def _delete(self, job_name: str) -> None:
        try:
            await self._call(
                "delete job",
                self._batch.delete_namespaced_job,
                job_name,
                self.namespace,
                body=self._delete_options,
            )
        except SandboxInfraError as error:
            if not not_found(error):  # else already gone (TTL controller or a concurrent reap)
                raise

    async def _delete_quietly(self, job_name: str) -> None:
        """Delete after a run; a failure is logged, the Job's TTL and deadline still bound it."""
        try:
            await self._delete(job_name)
        except SandboxInfraError as error:
            logger.warning("could not delete sandbox job %s: %s", job_name, error)

    async def close(self) -> None:
        for task in (self._poller, self._sweeper):
            if task is not None:
                task.cancel()
        await asyncio.to_thread(self._api_client.close)
