"""Waits for one Kubernetes backend instance's sandbox pods: one watch serves every run in flight.

    watcher = PodWatcher(core, namespace, selector, call)  # `kubernetes_api.call`, bound
    watcher.expect(job_name)                  # before the Job is created: no event is missed
    pod = await watcher.wait(job_name, deadline)   # its pod (a dict) once Succeeded or Failed
    watcher.forget(job_name)                  # always, when the run is over

One list of the instance's pods (by label), then a watch from that list's resourceVersion
(chunked JSON lines, each watch bounded by WATCH_S and resumed from the last version it
delivered; bookmarks keep the place): a pod costs the API server and this worker its own
changes, whatever the number of runs in flight (a list of every pod of the worker's, each spec
~90 KB, every 0.25 s, was 1.4 MB a list at 16 pods). A watch whose version the server no longer
holds (410 Gone) starts again with a list, and so does a failed list or watch, after a backoff
(RETRY_S doubled per failure, at most BACKOFF_MAX_S); only FAILURE_LIMIT failures in a row fail
the waiting runs (each also has its deadline). The watch stops when no run waits: its
connection is shut down, so no thread is left reading it. Pods are read as the API sends them
(dicts): building the client's models cost more than the rest of the worker's polling.

A pod that can never start fails its run at once, as a SandboxInfraError (the activity retries
it): a waiting reason in NEVER_STARTS, or a failed image pull (PULL_FAILURES) still failing
`pull_grace_s` after the Job was created (the kubelet retries pulls: a registry's hiccup
passes). They are the platform's configuration (the image's name, its registry or credentials,
a Secret or ConfigMap the pod needs), never the program's: every run fails alike, so the
sandbox activities' circuit breaker pauses them until an operator fixes it, and no sample is
scored; a configuration error that failed for good would fail the tasks, not the platform.

A Job with no pod `no_pod_grace_s` after its creation has its FailedCreate events read (then
every EVENTS_EVERY_S): the Job controller could not create the pod, and the newest event's
message fails the run. A LimitRange's bound refuses these limits (`LimitsRefused`: the task's,
the same on every try, never retried nor counted by the circuit breaker, which one large task
would otherwise open for every other); anything else (a quota exceeded, Pod Security, a
webhook) is the platform's (SandboxInfraError). Not covered: a pod that stays unschedulable
(no node fits; an autoscaler may add one): it waits for its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import re
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from infra.sandbox.base import SandboxInfraError
from infra.sandbox.kubernetes_job import JOB_LABEL, LimitsRefused

WATCH_S = 60
"""The server-side bound (timeoutSeconds) of one watch request; it is resumed after."""
FAILURE_LIMIT = 8
"""Lists and watches failing in a row (backing off up to BACKOFF_MAX_S) before the waiting
runs fail: about half a minute of an API server that answers nothing, not one throttled call."""
BACKOFF_MAX_S = 5.0
RETRY_S = 0.25
"""The first wait after a failed list or watch (doubled per failure in a row)."""
PULL_GRACE_S = 30.0
NO_POD_GRACE_S = 5.0
EVENTS_EVERY_S = 5.0
NEVER_STARTS = frozenset({"InvalidImageName", "CreateContainerConfigError", "ErrImageNeverPull"})
"""Waiting reasons no retry of the kubelet's changes."""
PULL_FAILURES = frozenset({"ErrImagePull", "ImagePullBackOff"})
LIMIT_RANGE = re.compile(r"\b(maximum|minimum) \S+ usage per (Container|Pod) is\b|ratio per")
"""How the LimitRanger admission plugin words a refusal (in a FailedCreate event's message)."""
logger = logging.getLogger(__name__)
Call = Callable[..., Awaitable[Any]]


def pod_state(pod: dict[str, Any]) -> str:
    """A sandbox pod's phase, and why its container waits if it does (reason: message)."""
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            why = ": ".join(str(w) for w in (waiting.get("reason"), waiting.get("message")) if w)
            return f"{status.get('phase')}: {why}"
    return str(status.get("phase") or "Unknown")


def waiting_reason(pod: dict[str, Any]) -> str:
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            return str(waiting.get("reason") or "")
    return ""


def refusal(job_name: str, message: str) -> Exception:
    """The error of a Job whose pod the API server refused with `message` (FailedCreate)."""
    text = f"kubernetes job {job_name} has no pod: {message}"
    if LIMIT_RANGE.search(message):
        return LimitsRefused(f"{text} (the sandbox namespace's LimitRange refuses these limits)")
    return SandboxInfraError(text)


@dataclass
class _Pending:
    """One run's wait: its pod's future, and what is known of the pod so far."""

    future: asyncio.Future[dict[str, Any]]
    created: float
    next_events: float
    state: str = "no pod yet"
    seen: bool = False
    reason: str = ""
    name: str = ""
    pull_timer: asyncio.TimerHandle | None = None


class PodWatcher:
    """Watches the pods `selector` selects in `namespace` for the runs that `expect` them."""

    def __init__(
        self,
        core: Any,
        namespace: str,
        selector: str,
        call: Call,
        *,
        retry_s: float = RETRY_S,
        request_timeout_s: float = 30.0,
        pull_grace_s: float = PULL_GRACE_S,
        no_pod_grace_s: float = NO_POD_GRACE_S,
    ) -> None:
        self._core, self.namespace, self.selector, self._call = core, namespace, selector, call
        self.retry_s, self.request_timeout_s = retry_s, request_timeout_s
        self.pull_grace_s, self.no_pod_grace_s = pull_grace_s, no_pod_grace_s
        self.error: SandboxInfraError | None = None
        self._pending: dict[str, _Pending] = {}
        self._task: asyncio.Task[None] | None = None
        self._stop = threading.Event()
        self._response: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def expect(self, job_name: str) -> None:
        """Start waiting for `job_name`'s pod (and the watch, if none runs)."""
        self._loop = asyncio.get_running_loop()
        now = time.monotonic()
        future: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._pending[job_name] = _Pending(future, now, now + self.no_pod_grace_s)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._watch())

    def forget(self, job_name: str) -> None:
        """Stop waiting for `job_name`'s pod; the watch stops with the last run waiting."""
        pending = self._pending.pop(job_name, None)
        if pending is not None and pending.pull_timer is not None:
            pending.pull_timer.cancel()
        if pending is not None and pending.future.done() and not pending.future.cancelled():
            pending.future.exception()  # retrieved: a run cancelled meanwhile never reads it
        if not self._pending:
            self._shutdown()

    async def wait(self, job_name: str, deadline: float) -> dict[str, Any]:
        """`job_name`'s pod once it succeeded or failed; SandboxInfraError (or LimitsRefused)
        if it never gets there: by `deadline`, or as soon as it is known it never will."""
        pending = self._pending[job_name]
        while True:
            wake = min(deadline, self._next_check(pending))
            await asyncio.wait({pending.future}, timeout=max(wake - time.monotonic(), 0.0))
            if pending.future.done():
                return pending.future.result()
            if time.monotonic() >= deadline:
                state = pending.state
                if self.error is not None:
                    state += f"; last pod list or watch: {self.error}"
                raise SandboxInfraError(
                    f"kubernetes job {job_name} did not finish in time ({state})"
                )
            if not pending.seen and time.monotonic() >= pending.next_events:
                pending.next_events = time.monotonic() + EVENTS_EVERY_S
                if error := await self._failed_create(job_name):
                    raise error

    @staticmethod
    def _next_check(pending: _Pending) -> float:
        """When `wait` looks for the events of a Job that has no pod yet."""
        return pending.next_events if not pending.seen else math.inf

    def _judge(self, pending: _Pending) -> None:
        """Fail the run of a pod that can never start: a waiting reason in NEVER_STARTS, or a
        failed pull still failing `pull_grace_s` after the Job's creation (judged again then)."""
        if pending.future.done():
            return
        pulled_until = pending.created + self.pull_grace_s
        failing = pending.reason in PULL_FAILURES
        if pending.reason in NEVER_STARTS or (failing and time.monotonic() >= pulled_until):
            error = SandboxInfraError(
                f"kubernetes pod {pending.name} cannot start ({pending.state})"
            )
            pending.future.set_exception(error)
        elif failing and pending.pull_timer is None:
            loop = asyncio.get_running_loop()
            delay = pulled_until - time.monotonic()
            pending.pull_timer = loop.call_later(delay, self._judge, pending)

    def _see(self, pod: dict[str, Any]) -> None:
        """A pod as listed or watched: resolve its run's wait, or note its state."""
        metadata = pod.get("metadata") or {}
        pending = self._pending.get((metadata.get("labels") or {}).get(JOB_LABEL) or "")
        if pending is None or pending.future.done():
            return
        pending.seen, pending.name = True, str(metadata.get("name"))
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            pending.future.set_result(pod)
            return
        pending.state, pending.reason = pod_state(pod), waiting_reason(pod)
        self._judge(pending)

    async def _failed_create(self, job_name: str) -> Exception | None:
        """The error of the Job's newest FailedCreate event, if it has one; a lookup that fails
        is logged and the run waits on (reading events is a diagnosis, not the run)."""
        selector = f"involvedObject.kind=Job,involvedObject.name={job_name},reason=FailedCreate"
        try:
            events = await self._call(
                "list events", self._core.list_namespaced_event, self.namespace,
                field_selector=selector,
            )  # fmt: skip
        except SandboxInfraError as error:
            logger.warning("cannot read the events of sandbox job %s: %s", job_name, error)
            return None
        messages = [str(event.message or "") for event in events.items or []]
        return refusal(job_name, messages[-1]) if messages else None

    async def _watch(self) -> None:
        """List, then watch, while runs wait; start over with a list after a failure or 410."""
        version: str | None = None
        failures = 0
        try:
            while self._pending:
                try:
                    if version is None:
                        version = await self._list()
                        continue  # the runs may be over (or resolved by the list)
                    self._stop.clear()
                    version = await self._call(
                        "watch pods", self._stream, version, attempts=1,
                        _request_timeout=(self.request_timeout_s, WATCH_S + 15),
                    )  # fmt: skip
                    failures, self.error = 0, None
                except SandboxInfraError as error:
                    version, failures, self.error = None, failures + 1, error
                    logger.warning("sandbox pod watch failed (%d in a row): %s", failures, error)
                    if failures >= FAILURE_LIMIT:
                        failed = f"{error} ({failures} pod lists and watches failed in a row)"
                        for pending in self._pending.values():
                            if not pending.future.done():
                                pending.future.set_exception(SandboxInfraError(failed))
                        failures = 0
                    delay = self.retry_s * 2 ** min(failures, 10)
                    await asyncio.sleep(min(delay, max(BACKOFF_MAX_S, self.retry_s)))
        except Exception as error:  # a bug, or an answer of a shape never seen: fail, not hang
            for pending in self._pending.values():
                if not pending.future.done():
                    pending.future.set_exception(
                        SandboxInfraError(f"the sandbox pod watch failed: {error!r}")
                    )
            raise
        finally:
            self._shutdown()

    async def _list(self) -> str:
        """List the pods (each resolves or updates its run); the list's resourceVersion."""

        def read(**kwargs: Any) -> dict[str, Any]:
            response = self._core.list_namespaced_pod(
                self.namespace, label_selector=self.selector, _preload_content=False, **kwargs
            )
            return dict(json.loads(response.data))

        body = await self._call("list pods", read, attempts=1)
        for pod in body.get("items") or []:
            self._see(pod)
        return str((body.get("metadata") or {}).get("resourceVersion") or "")

    def _stream(self, version: str, _request_timeout: Any = None) -> str | None:
        """One watch from `version` (in a thread): each pod event is handed to the loop. The
        last version delivered when it ends (its timeout, or `_shutdown`); None on 410 Gone."""
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        assert self._loop is not None
        if self._stop.is_set():  # shut down before it opened
            return version
        try:
            response = self._core.list_namespaced_pod(
                self.namespace, label_selector=self.selector, watch=True,
                resource_version=version, allow_watch_bookmarks=True, timeout_seconds=WATCH_S,
                _preload_content=False, _request_timeout=_request_timeout,
            )  # fmt: skip
        except ApiException as error:
            if error.status == 410:
                return None
            raise
        self._response = response
        try:
            if self._stop.is_set():  # shut down while it was opening
                return version
            for line in iter_resp_lines(response):
                event = json.loads(line) if line else {}
                kind, pod = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if pod.get("code") == 410:
                        return None
                    reason = f"{pod.get('reason')}: {pod.get('message')}"
                    raise ApiException(status=pod.get("code"), reason=reason)
                version = (pod.get("metadata") or {}).get("resourceVersion") or version
                if kind in ("ADDED", "MODIFIED"):
                    try:
                        self._loop.call_soon_threadsafe(self._see, pod)
                    except RuntimeError:  # the loop is closed: nobody waits any more
                        return version
        except Exception:
            if self._stop.is_set():  # our own shutdown ended the read
                return version
            raise
        finally:  # closed, never back in the pool: a shut-down socket reads nothing more
            self._response = None
            with contextlib.suppress(Exception):
                response.close()
                response.release_conn()
        return version

    def _shutdown(self) -> None:
        """End the watch now: its thread's read returns, and no run waits for it."""
        self._stop.set()
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()

    async def close(self) -> None:
        self._shutdown()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
