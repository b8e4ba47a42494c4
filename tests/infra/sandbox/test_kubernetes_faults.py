"""The Kubernetes backend against a flaky API server (the STUB of test_kubernetes.py, some client
calls failing first): throttling, 5xx and timeouts are retried, one failed pod list does not
abort the runs in flight, and a job too large for a pod is the request's fault, not retried."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from urllib3.exceptions import ReadTimeoutError

from activities.sandbox import SandboxActivities
from contracts.errors import ErrorType
from contracts.sandbox import ExecStatus, ExecuteItem, ExecuteRequest
from contracts.task import SandboxLimits
from infra import keys
from infra.circuit import CircuitState
from infra.sandbox import kubernetes_pods
from infra.sandbox.base import SandboxInfraError
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.infra.sandbox.recorded_k8s.stub_server import StubKubeApi

LIMITS = SandboxLimits(timeout_s=20)


def api_error(status: int, retry_after: str | None = None) -> ApiException:
    error = ApiException(status=status, reason="Too Many Requests" if status == 429 else "Error")
    error.headers = {"Retry-After": retry_after} if retry_after else None
    return error


def timeout() -> ReadTimeoutError:
    return ReadTimeoutError(None, "/apis", "Read timed out. (read timeout=30)")  # type: ignore[arg-type]


class Lost:
    """The call reaches the server, then its answer is lost (a timeout)."""


class Flaky:
    """A client method whose first calls fail with `failures` (then it works); `calls` times
    every call."""

    def __init__(self, method: Callable[..., Any], failures: list[BaseException | Lost]) -> None:
        self.method, self.failures, self.calls = method, failures, list[float]()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(time.monotonic())
        if not self.failures:
            return self.method(*args, **kwargs)
        failure = self.failures.pop(0)
        if isinstance(failure, Lost):
            self.method(*args, **kwargs)
            raise timeout()
        raise failure


@pytest.mark.asyncio
async def test_a_failed_pod_list_does_not_abort_the_runs_in_flight(stub: StubKubeApi) -> None:
    """One throttled list call failed every run waiting on the shared poller: each deleted its
    Job, its activity failed (a circuit-breaker failure) and was retried in full. The list and
    the watch are the same client method: each of the three failures is one of either."""
    backend = stub.backend(watch_retry_s=0.02)
    failures: list[BaseException | Lost] = [api_error(429), api_error(500), timeout()]
    backend._core.list_namespaced_pod = Flaky(backend._core.list_namespaced_pod, failures)  # type: ignore[method-assign]
    results = await asyncio.gather(*(backend.run(f"print({i})", limits=LIMITS) for i in range(2)))
    assert [r.status for r in results] == [ExecStatus.PASSED] * 2
    assert [r.stdout for r in results] == ["0\n", "1\n"] and not failures
    await backend.close()


@pytest.mark.asyncio
async def test_pod_lists_failing_again_and_again_fail_the_waiting_runs(
    stub: StubKubeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kubernetes_pods, "BACKOFF_MAX_S", 0.05)
    backend = stub.backend()
    failures: list[BaseException | Lost] = [api_error(503)] * 100
    backend._core.list_namespaced_pod = Flaky(backend._core.list_namespaced_pod, failures)  # type: ignore[method-assign]
    limit = kubernetes_pods.FAILURE_LIMIT
    with pytest.raises(
        SandboxInfraError, match=f"list pods: HTTP 503.*{limit} pod lists and watches failed"
    ):
        await backend.run("print(1)", limits=LIMITS)
    assert len(failures) == 100 - limit and stub.jobs == {}
    await backend.close()


@pytest.mark.asyncio
async def test_throttled_failing_and_timed_out_calls_are_retried(stub: StubKubeApi) -> None:
    backend = stub.backend(retry_wait_s=0.01)
    create = Flaky(backend._batch.create_namespaced_job, [api_error(429, retry_after="1")])
    read_log = Flaky(backend._core.read_namespaced_pod_log, [timeout(), api_error(502)])
    delete = Flaky(backend._batch.delete_namespaced_job, [api_error(503)])
    reap = Flaky(backend._batch.list_namespaced_job, [api_error(500)])
    backend._batch.create_namespaced_job = create  # type: ignore[method-assign]
    backend._core.read_namespaced_pod_log = read_log  # type: ignore[method-assign]
    backend._batch.delete_namespaced_job = delete  # type: ignore[method-assign]
    backend._batch.list_namespaced_job = reap  # type: ignore[method-assign]
    result = await backend.run("print('ok')", limits=LIMITS)
    assert result.status is ExecStatus.PASSED and result.stdout == "ok\n"
    assert (len(create.calls), len(read_log.calls), len(delete.calls), len(reap.calls)) == (
        2,
        3,
        2,
        2,
    )
    assert create.calls[1] - create.calls[0] >= 1.0  # the server's Retry-After, not our 10 ms
    assert stub.jobs == {}
    await backend.close()


@pytest.mark.asyncio
async def test_a_retried_create_that_finds_its_job_goes_on(stub: StubKubeApi) -> None:
    """The first create reached the server but its answer was lost: the retry gets 409."""
    backend = stub.backend(retry_wait_s=0.01)
    create = Flaky(backend._batch.create_namespaced_job, [Lost(), api_error(409)])
    backend._batch.create_namespaced_job = create  # type: ignore[method-assign]
    result = await backend.run("print('once')", limits=LIMITS)
    assert result.status is ExecStatus.PASSED and result.stdout == "once\n"
    assert len(create.calls) == 2 and stub.jobs == {}
    await backend.close()


@pytest.mark.asyncio
async def test_a_job_too_large_for_a_pod_is_invalid_input(
    stub: StubKubeApi, store: ObjectStore
) -> None:
    """A plain ValueError was retried by Temporal without end, failing the same way each time."""
    program = "# " + "x" * (1 << 20) + "\ndef add(a, b):\n    return a + b\n"
    code = store.put_text(keys.turn_key("run-k8s", "add", 0, 0, "code.py"), program)
    req = ExecuteRequest(
        run_id="run-k8s",
        task_id="add",
        turn=0,
        tests="assert add(1, 2) == 3",
        limits=LIMITS,
        items=[ExecuteItem(sample=0, code=code)],
    )
    acts = SandboxActivities(Settings(), store=store, backend=stub.backend())
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(acts.execute, req)
    await acts.close()
    error = caught.value
    assert error.type == ErrorType.INVALID_INPUT and error.non_retryable
    assert "task add sample 0" in str(error) and "at most 1048576" in str(error)
    assert acts.breaker.state is CircuitState.CLOSED and stub.jobs == {}
    assert not [m for m, _ in stub.requests if m == "POST"]  # nothing was created


@pytest.mark.parametrize(
    ("reason", "message"),
    [
        ("InvalidImageName", 'couldn\'t parse image name "python:3.11 slim": invalid reference'),
        ("CreateContainerConfigError", 'secret "sandbox-env" not found'),
    ],
)
@pytest.mark.asyncio
async def test_a_pod_that_can_never_start_fails_at_once(
    stub: StubKubeApi, reason: str, message: str
) -> None:
    """Its waiting reason was recorded but reported only at the deadline: timeout_s + 70 s
    for every try of every run, with the sandbox queue's activities retried all along."""
    stub.waiting = (reason, message)
    started = time.monotonic()
    with pytest.raises(SandboxInfraError, match=f"cannot start.*{reason}: {re.escape(message)}"):
        await asyncio.wait_for(stub.backend().run("print(1)", limits=LIMITS), 20)
    assert time.monotonic() - started < 5 and stub.jobs == {}


@pytest.mark.asyncio
async def test_an_image_that_cannot_be_pulled_fails_after_a_bound(stub: StubKubeApi) -> None:
    """A failed pull may pass on the kubelet's next try (a registry's hiccup): the run waits
    `pull_grace_s` for it, not its whole deadline."""
    stub.waiting = ("ImagePullBackOff", 'Back-off pulling image "registry.example.com/py:3.11"')
    backend = stub.backend(pull_grace_s=1.0)
    started = time.monotonic()
    with pytest.raises(SandboxInfraError, match="cannot start.*ImagePullBackOff: Back-off"):
        await asyncio.wait_for(backend.run("print(1)", limits=LIMITS), 20)
    assert 1.0 <= time.monotonic() - started < 6 and stub.jobs == {}
    await backend.close()


QUOTA_REFUSAL = (
    'Error creating: pods "tempered-sbx-0a1b2c3d4e5f-x7k2p" is forbidden: exceeded quota: '
    "tempered-sandbox, requested: pods=1, used: pods=64, limited: pods=64"
)
LIMIT_RANGE_REFUSAL = (
    'Error creating: pods "tempered-sbx-0a1b2c3d4e5f-x7k2p" is forbidden: maximum memory usage'
    " per Container is 8Gi, but limit is 9344Mi"
)


@pytest.mark.asyncio
async def test_a_job_whose_pod_the_quota_refuses_fails_fast(stub: StubKubeApi) -> None:
    """The Job controller could not create the pod (FailedCreate events): the run waited for a
    pod until its deadline and said only "no pod yet"."""
    stub.failed_create = QUOTA_REFUSAL
    backend = stub.backend(no_pod_grace_s=0.5)
    started = time.monotonic()
    with pytest.raises(SandboxInfraError, match="no pod: .*exceeded quota: tempered-sandbox"):
        await asyncio.wait_for(backend.run("print(1)", limits=LIMITS), 20)
    assert time.monotonic() - started < 5 and stub.jobs == {}
    assert stub.event_selectors and all(
        "involvedObject.name=tempered-sbx-" in s and "reason=FailedCreate" in s
        for s in stub.event_selectors
    )
    await backend.close()


@pytest.mark.asyncio
async def test_a_job_over_the_namespaces_limit_range_is_refused_for_good(
    stub: StubKubeApi, store: ObjectStore
) -> None:
    """A pod over the LimitRange's max is refused every time, for this task's limits only: as
    an infra error it was retried for ever, and its failures opened the circuit breaker for
    every other task's runs."""
    stub.failed_create = LIMIT_RANGE_REFUSAL
    code = store.put_text(keys.turn_key("run-k8s", "add", 0, 0, "code.py"), "print(1)")
    req = ExecuteRequest(
        run_id="run-k8s",
        task_id="add",
        turn=0,
        tests="",
        limits=SandboxLimits(timeout_s=20, memory_mb=9000),
        items=[ExecuteItem(sample=0, code=code)],
    )
    acts = SandboxActivities(Settings(), store=store, backend=stub.backend(no_pod_grace_s=0.5))
    with pytest.raises(ApplicationError) as caught:
        await asyncio.wait_for(ActivityEnvironment().run(acts.execute, req), 20)
    await acts.close()
    error = caught.value
    assert error.type == ErrorType.INVALID_INPUT and error.non_retryable
    assert "task add sample 0" in str(error) and "maximum memory usage per Container" in str(error)
    assert acts.breaker.state is CircuitState.CLOSED and stub.jobs == {}
