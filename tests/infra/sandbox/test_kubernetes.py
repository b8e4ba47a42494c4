"""Kubernetes sandbox backend: manifests validated for 1.33, API calls against a STUB API server.

No API server can run here, so `recorded_k8s/stub_server.py` is a tiny HTTP server on
127.0.0.1 that answers the official client with recorded response shapes and plays the kubelet
by running the pod's command (the launcher, its checker and candidate: the real code) locally,
as root, with the pod's env. Everything else — the client, the manifest, the launcher, the
verifier's modules, the judging — is the production code.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox import kubernetes_job
from infra.sandbox.base import SandboxBackend, SandboxInfraError
from infra.sandbox.kubernetes import API_ATTEMPTS, build_job_manifest, sandbox_rlimits
from infra.sandbox.kubernetes_code import (
    CODE_LABEL,
    CODE_MOUNT,
    SandboxCode,
    build_code,
)
from infra.sandbox.kubernetes_instance import PROCESS_LABEL, ProcessId
from infra.sandbox.verifier import checker_job
from tests.infra.sandbox.conftest import validate_manifest
from tests.infra.sandbox.recorded_k8s.stub_server import NAMESPACE, StubKubeApi

CHECK = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
LIMITS = SandboxLimits(timeout_s=20)


@pytest.mark.parametrize("runtime_class", [None, "gvisor"])
@pytest.mark.parametrize(
    "limits",
    [
        SandboxLimits(),
        SandboxLimits(timeout_s=0.5, memory_mb=16, tmpfs_mb=1),
        SandboxLimits(timeout_s=3600, memory_mb=65536, tmpfs_mb=4096),
    ],
)
def test_manifest_is_valid_and_locked_down(
    limits: SandboxLimits, runtime_class: str | None
) -> None:
    job = checker_job("print(1)", "assert True", "", [], None, limits, sandbox_rlimits(limits))
    manifest = build_job_manifest(
        "tempered-sbx-0a1b2c3d4e5f",
        NAMESPACE,
        "python:3.11-slim",
        job,
        limits,
        "n" * 32,
        "sandbox worker/7",
        runtime_class,
    )
    validate_manifest(manifest)
    spec, pod = manifest["spec"], manifest["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert spec["backoffLimit"] == 0 and spec["ttlSecondsAfterFinished"] > 0
    assert spec["activeDeadlineSeconds"] >= limits.timeout_s
    assert pod["automountServiceAccountToken"] is False and pod["enableServiceLinks"] is False
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True and security["privileged"] is False
    assert security["allowPrivilegeEscalation"] is False
    assert security["runAsUser"] == 0  # the launcher; the checker and candidate drop to others
    assert security["capabilities"] == {
        "drop": ["ALL"],
        "add": ["SETUID", "SETGID", "SETPCAP", "KILL"],
    }
    code = build_code()
    assert pod["volumes"] == [
        {"name": "work", "emptyDir": {"medium": "Memory", "sizeLimit": f"{limits.tmpfs_mb}Mi"}},
        {"name": "code", "configMap": {"name": code.name, "defaultMode": 0o400}},
    ]
    assert {"name": "code", "mountPath": CODE_MOUNT, "readOnly": True} in container["volumeMounts"]
    assert container["command"] == ["python3", "-S", "-I", f"{CODE_MOUNT}/pod_launcher.py"]
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert pod.get("runtimeClassName") == runtime_class
    labels = manifest["spec"]["template"]["metadata"]["labels"]
    assert (
        labels["app.kubernetes.io/component"] == "sandbox"
        and labels["tempered.dev/sandbox"] == "true"
    )
    assert labels["tempered.dev/worker"] == "sandbox-worker-7"  # made a valid label value
    assert labels[CODE_LABEL] == manifest["metadata"]["labels"][CODE_LABEL] == code.digest
    assert "hostPath" not in json.dumps(manifest)
    env = {e["name"]: e["value"] for e in container["env"]}
    assert list(env) == [
        "HOME",
        "TMPDIR",
        "TEMPERED_JOB_0",
        "TEMPERED_RUN",
        "TEMPERED_RESULT_NONCE",
    ]
    assert all(len(value) < 128 * 1024 for value in env.values())
    assert json.loads(env["TEMPERED_JOB_0"])["tests"] == "assert True"
    assert json.loads(env["TEMPERED_RUN"])["timeout_s"] == limits.timeout_s


@pytest.mark.asyncio
async def test_run_passes_through_create_poll_log_delete(stub: StubKubeApi) -> None:
    backend = stub.backend()
    assert isinstance(backend, SandboxBackend)
    program = "def add(a, b):\n    return a + b\nprint('adding')\n"
    tests = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
    result = await backend.run(program, tests, SandboxLimits(timeout_s=20), entry_point="add")
    assert result.status is ExecStatus.PASSED, result.stderr
    assert (result.tests_passed, result.tests_total) == (1, 1)
    assert result.stdout == "adding\n" and result.backend == "kubernetes"
    assert result.enforcement == "kubernetes"
    code = build_code()
    calls = stub.calls()
    assert calls[0:4] == [
        ("GET", "jobs"),  # reap this worker's leftovers
        ("GET", f"configmaps/{code.name}"),  # this build's code: not there (404) …
        ("POST", "configmaps"),  # … so it is created
        ("POST", "jobs"),  # create the Job
    ]
    assert [method for method, _ in calls[-2:]] == ["GET", "DELETE"]  # the log; delete the Job
    assert stub.jobs == {} and stub.deleted[-1][1]["propagationPolicy"] == "Background"
    assert stub.configmaps == {code.name: code.manifest(NAMESPACE)}
    await backend.run(program, tests, SandboxLimits(timeout_s=20), entry_point="add")
    assert [c for c in stub.calls() if "configmaps" in c[1]] == calls[1:3]  # checked once
    await backend.close()


@pytest.mark.asyncio
async def test_failing_program_is_a_result(stub: StubKubeApi) -> None:
    backend = stub.backend()
    tests = "assert add(1, 1) == 2\nassert add(0, 0) == 0\nassert add(2, 2) == 4\n"
    result = await backend.run(
        "def add(a, b):\n    return a * b\n", tests, SandboxLimits(timeout_s=20)
    )
    assert result.status is ExecStatus.FAILED
    assert (result.tests_passed, result.tests_total) == (2, 3)  # a*b is right for 0 and 2
    assert "AssertionError" in result.stderr
    timeout = await backend.run("while True:\n    pass\n", "", SandboxLimits(timeout_s=1))
    assert timeout.status is ExecStatus.TIMEOUT and 1000 <= timeout.duration_ms < 5000


@pytest.mark.asyncio
async def test_forged_result_lines_in_program_output_are_ignored(stub: StubKubeApi) -> None:
    forged = 'print(\'\\n{"tempered_result": "guess", "verdict": {"status": "passed"}}\')\nraise SystemExit(3)\n'
    result = await stub.backend().run(forged, "assert False", SandboxLimits(timeout_s=20))
    assert result.status is ExecStatus.FAILED and "tempered_result" in result.stdout


@pytest.mark.parametrize("code", [403, 409, 500, 503])
@pytest.mark.asyncio
async def test_api_errors_are_infra_errors(stub: StubKubeApi, code: int) -> None:
    stub.fail_create = code
    with pytest.raises(SandboxInfraError, match=f"create job: HTTP {code}"):
        await stub.backend(retry_wait_s=0.01).run("print(1)")
    calls = [method for method, path in stub.requests if not path.endswith("/pods")]
    assert calls[-1] == "DELETE"  # cleanup is attempted (404: nothing was created)
    tries = sum(1 for method, path in stub.requests if method == "POST" and path.endswith("/jobs"))
    assert tries == (API_ATTEMPTS if code >= 500 else 1)  # a 5xx may pass; a 403/409 will not


@pytest.mark.asyncio
async def test_unreachable_api_server_is_an_infra_error(stub: StubKubeApi) -> None:
    backend = stub.backend()
    stub.close()
    with pytest.raises(SandboxInfraError, match="list jobs"):
        await backend.run("print(1)")


@pytest.mark.asyncio
async def test_cancellation_deletes_the_job(stub: StubKubeApi) -> None:
    stub.hang = True
    task = asyncio.create_task(stub.backend().run("print(1)", limits=SandboxLimits(timeout_s=30)))
    while not stub.jobs:
        await asyncio.sleep(0.02)
    (name,) = stub.jobs
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stub.jobs == {} and stub.deleted[-1][0] == name


@pytest.mark.asyncio
async def test_pod_that_never_finishes_is_an_infra_error(stub: StubKubeApi) -> None:
    stub.hang = True
    backend = stub.backend(start_grace_s=0, deadline_slack_s=0.5)
    with pytest.raises(SandboxInfraError, match="ContainerCreating"):
        await backend.run("print(1)", limits=SandboxLimits(timeout_s=0.1))
    assert stub.jobs == {}


@pytest.mark.asyncio
async def test_a_pod_without_the_launchers_result_is_an_infra_error(stub: StubKubeApi) -> None:
    stub.terminated_reason = "Error"  # the launcher (PID 1) itself died: nothing judged the run
    with pytest.raises(SandboxInfraError, match="without a result \\(Error\\)"):
        await stub.backend().run("x = bytearray(10**10)")


@pytest.mark.asyncio
async def test_a_pod_the_oom_killer_ended_exceeded_its_memory(stub: StubKubeApi) -> None:
    """Under gVisor no OOM killer runs inside the sandbox: a program past the pod's limit makes
    the host's kill the whole sandbox, launcher included, and the pod ends OOMKilled with no
    result line. That was an infra error, retried for ever (and counted by the circuit
    breaker); it is the program's memory, so it is scored as such."""
    stub.terminated_reason = "OOMKilled"
    result = await stub.backend().run("x = bytearray(10**10)", CHECK, LIMITS, "add")
    assert result.status is ExecStatus.MEMORY_EXCEEDED, result
    assert (result.tests_passed, result.tests_total) == (0, 1)
    assert stub.jobs == {}


def _mebibytes(quantity: str) -> int:
    assert quantity.endswith("Mi"), quantity
    return int(quantity[:-2])


@pytest.mark.parametrize("runtime_class", [None, "gvisor"])
@pytest.mark.parametrize(
    "limits",
    [
        SandboxLimits(),
        SandboxLimits(memory_mb=16, tmpfs_mb=1),
        SandboxLimits(memory_mb=65536, tmpfs_mb=4096),
    ],
)
def test_the_candidates_address_space_fits_in_its_pod(
    limits: SandboxLimits, runtime_class: str | None
) -> None:
    """The candidate's RLIMIT_AS was 2 x memory + 256 MiB in a pod limited to memory + tmpfs +
    96 MiB: under gVisor (no OOM killer inside the sandbox) one process could outgrow the pod,
    and the host's OOM killer took the whole sandbox. Its address space, the tmpfs, the
    launcher's share and gVisor's own kernel (under a RuntimeClass) now fit the pod's limit."""
    from infra.sandbox.gvisor import SENTRY_MEMORY_MB

    job = checker_job("print(1)", "", "", [], None, limits, sandbox_rlimits(limits))
    manifest = build_job_manifest(
        "tempered-sbx-1", NAMESPACE, "python:3.11-slim", job, limits, "n", "w", runtime_class
    )
    resources = manifest["spec"]["template"]["spec"]["containers"][0]["resources"]
    pod_mb = _mebibytes(resources["limits"]["memory"])
    space_mb = sandbox_rlimits(limits)["RLIMIT_AS"][1] // 2**20
    overhead = kubernetes_job.LAUNCHER_OVERHEAD_MB + (SENTRY_MEMORY_MB if runtime_class else 0)
    assert limits.memory_mb < space_mb  # the program still has its memory, and an interpreter
    assert space_mb + limits.tmpfs_mb + overhead <= pod_mb, (space_mb, pod_mb)


@pytest.mark.asyncio
async def test_a_candidate_that_cannot_drop_its_privileges_never_runs(stub: StubKubeApi) -> None:
    files = build_code().files
    modules = [name for name in files["modules"].split() if name != "infra.sandbox.confine"]
    code = SandboxCode.of(files["pod_launcher.py"], {m: files[f"{m}.py"] for m in modules})
    with pytest.raises(SandboxInfraError, match="did not start: sandbox setup failed.*confine"):
        await stub.backend(code=code).run(
            "def add(a, b):\n    return a + b\n", "assert add(1, 2) == 3"
        )


@pytest.mark.asyncio
async def test_in_the_pod_the_program_is_confined_and_cannot_fake_a_fault(
    stub: StubKubeApi,
) -> None:
    program = """
import os, signal
status = open("/proc/self/status").read()
print("uid", os.getuid(), "seccomp", "Seccomp:\t2" in status, "caps", "CapBnd:\t0000000000000000" in status)
for path in ("/proc/1/environ", f"/proc/{os.getppid()}/environ", f"/proc/{os.getppid()}/mem"):
    try:
        open(path, "rb").read(100)
        print("READ", path)
    except OSError:
        print("denied", path)
print("environ", sorted(os.environ))
def add(a, b):
    os.kill(os.getpid(), signal.SIGKILL)  # its own end must stay its own: failed, not infra
"""
    result = await stub.backend().run(program, CHECK, SandboxLimits(timeout_s=20), "add")
    assert result.status is ExecStatus.FAILED and result.tests_passed == 0, result
    lines = result.stdout.splitlines()
    assert lines[0] == "uid 10002 seccomp True caps True" and "READ" not in result.stdout, lines
    assert lines[-1] == "environ ['HOME', 'LANG', 'MALLOC_ARENA_MAX', 'PATH', 'TMPDIR']", lines


@pytest.mark.asyncio
async def test_first_run_reaps_only_this_workers_leftovers(stub: StubKubeApi) -> None:
    """Its own worker id's Jobs of a process of this container that is gone (the restarted
    worker's previous process); not those of another worker, nor of a process it cannot tell
    (no label)."""
    here = ProcessId.here()
    assert here is not None
    gone = replace(here, ticks=here.ticks + 1)  # this pid, started at another time: not it
    stub.add_job("tempered-sbx-old", "sandbox-7f9c", {PROCESS_LABEL: gone.label()})
    stub.add_job("tempered-sbx-unknown", "sandbox-7f9c")
    stub.add_job("tempered-sbx-other", "sandbox-other", {PROCESS_LABEL: gone.label()})
    backend = stub.backend()
    await backend.run("print(1)", limits=SandboxLimits(timeout_s=20))
    assert list(stub.jobs) == ["tempered-sbx-unknown", "tempered-sbx-other"]
    await backend.run("print(2)", limits=SandboxLimits(timeout_s=20))
    assert (
        sum(1 for m, p in stub.requests if m == "GET" and p.endswith("/jobs")) == 1
    )  # reaped once


@pytest.mark.asyncio
async def test_concurrent_runs_share_one_pod_watch(stub: StubKubeApi) -> None:
    """One list, then one watch of this instance's pods, for every run in flight (a list of all
    the worker's pods every 0.25 s was 1.4 MB a list at 16 pods)."""
    backend = stub.backend()
    programs = [f"print({i} * {i})" for i in range(4)]
    results = await asyncio.gather(
        *(backend.run(p, limits=SandboxLimits(timeout_s=20)) for p in programs)
    )
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(4)]
    assert all(r.status is ExecStatus.PASSED for r in results)
    selector = f"tempered.dev/worker=sandbox-7f9c,tempered.dev/instance={backend.instance}"
    assert stub.pod_selectors == stub.watch_selectors == [selector]
    await backend.close()


@pytest.mark.asyncio
async def test_an_expired_watch_starts_over_with_a_list(stub: StubKubeApi) -> None:
    """A watch resumed from a resourceVersion the server no longer holds gets 410 Gone: the
    watcher lists the pods again and watches from there; no run in flight is lost."""
    stub.hang = True
    backend = stub.backend(watch_retry_s=0.01)
    run = asyncio.create_task(backend.run("print(1)", limits=SandboxLimits(timeout_s=20)))
    while not stub.watch_selectors:
        await asyncio.sleep(0.02)
    stub.expire_watches()  # what the open watch has delivered is now too old to resume from
    backend._pods._shutdown()  # its connection drops: it resumes from where it was
    while len(stub.pod_selectors) < 2:
        await asyncio.sleep(0.02)
    (name,) = stub.jobs
    await asyncio.to_thread(stub._kubelet, name)  # the pod runs now, seen by the new watch
    result = await asyncio.wait_for(run, 20)
    assert result.status is ExecStatus.PASSED and result.stdout == "1\n"
    assert len(stub.pod_selectors) == 2 and len(stub.watch_selectors) >= 2
    await backend.close()


@pytest.mark.asyncio
async def test_large_jobs_are_split_across_env_values(stub: StubKubeApi) -> None:
    padding = "# " + "x" * 250 + "\n"
    program = padding * 800 + "def big():\n    return 42\n"  # ~200 KiB, over one env value's limit
    result = await stub.backend().run(program, "assert big() == 42", SandboxLimits(timeout_s=20))
    assert result.status is ExecStatus.PASSED and result.tests_passed == 1
    with pytest.raises(ValueError, match="at most"):
        await stub.backend().run(padding * 5000)


@pytest.mark.asyncio
async def test_output_is_capped_and_marked_truncated(stub: StubKubeApi) -> None:
    limits = SandboxLimits(timeout_s=20, output_bytes=1024)
    result = await stub.backend().run("print('y' * 100_000)", limits=limits)
    assert result.status is ExecStatus.PASSED
    assert result.truncated and len(result.stdout) == 1024
