"""The pure half of the Kubernetes sandbox backend: the Job manifest and reading its result.

No API calls here (those are in `kubernetes.py`), so every manifest can be validated offline:

    job = HarnessJob(program, tests, entry_point, limits, sandbox_rlimits(limits))
    manifest = build_job_manifest("tempered-sbx-1a2b", "tempered-sandbox", "python:3.11-slim",
                                  job, result_nonce, worker_id="sandbox-0")

The Job: non-root uid 65534, read-only root, all capabilities dropped, seccomp RuntimeDefault,
no service-account token, no service links, a memory-backed emptyDir work dir, requests =
limits, `activeDeadlineSeconds`, `ttlSecondsAfterFinished`, `backoffLimit: 0`, optional
`runtimeClassName`, and the labels the chart's deny-all NetworkPolicy selects. The harness, the
job (program, tests, host nonce) and the launcher travel in the pod spec (env/args), never
as host paths or mounted files the program could read; `pod_launcher.py` is PID 1.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from contracts.task import SandboxLimits
from infra.sandbox.process import VERDICT_CAP, Capture, HarnessJob, HarnessOutcome

HARNESS_SOURCE = (Path(__file__).parent / "harness.py").read_text()
"""The in-sandbox harness, shipped in the pod's env (the pod image has no Tempered)."""
LAUNCHER_SOURCE = (Path(__file__).parent / "pod_launcher.py").read_text()
CONTAINER = "sandbox"
WORKER_LABEL = "tempered.dev/worker"
JOB_LABEL = "tempered.dev/job"
SANDBOX_LABELS = {"app.kubernetes.io/component": "sandbox", "tempered.dev/sandbox": "true"}
LAUNCHER_OVERHEAD_MB = 48
"""Memory of the launcher and interpreter on top of the program's `memory_mb` and tmpfs."""
START_GRACE_S = 60
"""Seconds a pod may take to be scheduled and started before its deadline counts as ours."""
TTL_AFTER_FINISHED_S = 300
ENV_CHUNK = 96 * 1024
"""One env value stays under Linux's 128 KiB MAX_ARG_STRLEN; the job is split into chunks."""
MAX_JOB_BYTES = 1024 * 1024
"""Largest job (program + tests) a pod spec carries (etcd keeps objects under 1.5 MiB)."""


def label_value(text: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_.-]", "-", text)[:63].strip("-_.")
    return cleaned or "worker"


def sandbox_rlimits(limits: SandboxLimits) -> dict[str, tuple[int, int]]:
    """Rlimits the harness sets on itself in the pod. Memory and processes are the cgroup's job
    (container limits, the node's pod pids limit): uid 65534 is shared by every sandbox pod on
    a node, so a per-uid RLIMIT_NPROC would make pods starve each other."""
    file_size = limits.file_size_mb * 2**20
    return {
        "RLIMIT_CPU": (limits.cpu_s, limits.cpu_s + 1),
        "RLIMIT_FSIZE": (file_size, file_size),
        "RLIMIT_CORE": (0, 0),
    }


def job_env(job: HarnessJob) -> list[dict[str, str]]:
    """The harness job as TEMPERED_JOB_0..N env values (ASCII JSON, each under ENV_CHUNK)."""
    payload = job.payload(verdict_fd=-1).decode("ascii")
    if len(payload) > MAX_JOB_BYTES:
        raise ValueError(
            f"program + tests are {len(payload)} bytes; a sandbox Job carries at most {MAX_JOB_BYTES}"
        )
    chunks = [payload[i : i + ENV_CHUNK] for i in range(0, len(payload), ENV_CHUNK)]
    return [{"name": f"TEMPERED_JOB_{i}", "value": chunk} for i, chunk in enumerate(chunks)]


def build_job_manifest(
    name: str,
    namespace: str,
    image: str,
    job: HarnessJob,
    result_nonce: str,
    worker_id: str,
    runtime_class: str | None = None,
    cpu: str = "1",
    start_grace_s: int = START_GRACE_S,
) -> dict[str, Any]:
    """The batch/v1 Job running the harness `job` under `job.limits`; pure, no API calls."""
    limits = job.limits
    run = {"timeout_s": limits.timeout_s, "output_bytes": limits.output_bytes}
    memory = f"{limits.memory_mb + limits.tmpfs_mb + LAUNCHER_OVERHEAD_MB}Mi"
    labels = {
        **SANDBOX_LABELS,
        WORKER_LABEL: label_value(worker_id),
        JOB_LABEL: name,
        "app.kubernetes.io/name": "tempered",
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 1,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65534,
            "runAsGroup": 65534,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": CONTAINER,
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "-S", "-I", "-c", LAUNCHER_SOURCE],
                "workingDir": "/work",
                "env": [
                    {"name": "HOME", "value": "/work"},
                    {"name": "TMPDIR", "value": "/work"},
                    {"name": "TEMPERED_HARNESS", "value": HARNESS_SOURCE},
                    *job_env(job),
                    {"name": "TEMPERED_RUN", "value": json.dumps(run)},
                    {"name": "TEMPERED_RESULT_NONCE", "value": result_nonce},
                ],
                "resources": {
                    "requests": {"cpu": cpu, "memory": memory},
                    "limits": {"cpu": cpu, "memory": memory},
                },
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "privileged": False,
                    "readOnlyRootFilesystem": True,
                    "runAsNonRoot": True,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [{"name": "work", "mountPath": "/work"}],
            }
        ],
        "volumes": [
            {"name": "work", "emptyDir": {"medium": "Memory", "sizeLimit": f"{limits.tmpfs_mb}Mi"}}
        ],
    }
    if runtime_class:
        pod_spec["runtimeClassName"] = runtime_class
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": math.ceil(limits.timeout_s) + start_grace_s,
            "ttlSecondsAfterFinished": TTL_AFTER_FINISHED_S,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def parse_pod_log(log: str, result_nonce: str) -> dict[str, Any] | None:
    """The launcher's result line carrying `result_nonce` (the last one), or None."""
    found = None
    for line in log.splitlines():
        if result_nonce not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("tempered_result") == result_nonce:
            found = record
    return found


def outcome_from_launcher(job: HarnessJob, record: dict[str, Any]) -> HarnessOutcome:
    """The launcher's report as the `HarnessOutcome` the process-based backends produce."""

    def capture(key: str, limit: int) -> Capture:
        text = str(record.get(key, ""))
        return Capture(limit, bytearray(text.encode()), bool(record.get(f"{key}_truncated")))

    return HarnessOutcome(
        job,
        returncode=record.get("exit_code"),
        timed_out=bool(record.get("timed_out")),
        duration_ms=max(int(record.get("duration_ms", 0)), 0),
        stdout=capture("stdout", job.limits.output_bytes),
        stderr=capture("stderr", job.limits.output_bytes),
        verdict_stream=capture("verdict_stream", VERDICT_CAP),
    )
