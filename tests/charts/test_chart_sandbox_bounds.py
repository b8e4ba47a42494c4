"""The sandbox namespace's bounds: a namespace of its own, and a quota that holds the memory of
the sandbox workers' Jobs at their largest.

sandbox.namespace equal to the release namespace put the sandbox LimitRange and ResourceQuota on
the workers' own pods (LimitRanger then refused the inference and learner pods) and, with
createNamespace, a Namespace that exists already. The quota check (tempered.checkSandboxQuota)
counted pods, Jobs and CPU only: each sandbox pod's memory (request = limit,
kubernetes_job.pod_memory_mb, bounded per container by limitRange.max.memory) times the Jobs
went past the default quota's memory, and a Job over the quota has no pod (an infra error,
retried). Skipped without helm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contracts.task import SandboxLimits
from infra.sandbox import kubernetes_job
from infra.sandbox.kubernetes import build_job_manifest, sandbox_rlimits
from infra.sandbox.verifier import checker_job
from tests.charts.chart import (
    RELEASE_NAMESPACE,
    VALUE_SETS,
    deployments,
    needs_helm,
    objects,
    refused,
    render,
    value_set_id,
)
from tests.charts.test_chart_sandbox import _quantity, quota_refusal, sandbox_jobs_at_most

pytestmark = needs_helm


@pytest.mark.parametrize("create", ["true", "false"])
def test_the_sandbox_namespace_may_not_be_the_release_namespace(create: str) -> None:
    refusal = refused(
        f"sandbox.namespace={RELEASE_NAMESPACE}",
        f"sandbox.createNamespace={create}",
        namespace=RELEASE_NAMESPACE,
    )
    assert f"sandbox.namespace is the release namespace ({RELEASE_NAMESPACE})" in refusal, refusal


def test_a_release_without_the_sandbox_worker_may_share_its_namespace() -> None:
    """Nothing of the sandbox namespace renders then (a side release of agent-tasks)."""
    docs = render(None, "workers.sandbox.enabled=false", f"sandbox.namespace={RELEASE_NAMESPACE}")
    assert not objects(docs, "LimitRange") and not objects(docs, "ResourceQuota")


def _job_pod() -> dict[str, Any]:
    limits = SandboxLimits()
    job = checker_job("print(1)", "", "", [], None, limits, sandbox_rlimits(limits))
    manifest = build_job_manifest(
        "tempered-sbx-1", "tempered-sandbox", "python:3.11-slim", job, limits, "n", "w"
    )
    pod: dict[str, Any] = manifest["spec"]["template"]["spec"]
    return pod


def test_a_sandbox_pod_is_one_container_as_large_as_its_task() -> None:
    """What the chart's bound of a pod's memory (limitRange.max.memory plus the RuntimeClass's
    overhead) stands on: one container, no init container, memory request = limit = the task's
    pod_memory_mb, which grows with the task's memory_mb (the contract allows 65536)."""
    pod = _job_pod()
    assert len(pod["containers"]) == 1 and not pod.get("initContainers")
    resources = pod["containers"][0]["resources"]
    assert resources["requests"]["memory"] == resources["limits"]["memory"]
    assert resources["limits"]["memory"] == f"{kubernetes_job.pod_memory_mb(SandboxLimits())}Mi"
    assert kubernetes_job.pod_memory_mb(SandboxLimits(memory_mb=65536)) > 64 * 1024


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_sandbox_jobs_at_their_largest_fit_the_quota_memory(values: Path | None) -> None:
    """(max) replicas plus surge x concurrency Jobs, each a pod of up to limitRange.max.memory
    plus the RuntimeClass's overhead, within requests.memory, memory and limits.memory."""
    docs = render(values)
    quota = [q["spec"]["hard"] for q in objects(docs, "ResourceQuota").values()]
    limit_ranges = list(objects(docs, "LimitRange").values())
    if not quota or not limit_ranges or "sandbox" not in deployments(docs):
        return
    (hard,) = quota
    (limit_range,) = limit_ranges
    jobs = sandbox_jobs_at_most(docs)
    pod = _quantity(limit_range["spec"]["limits"][0]["max"]["memory"])
    for runtime_class in objects(docs, "RuntimeClass").values():
        pod += _quantity(runtime_class.get("overhead", {}).get("podFixed", {}).get("memory", "0"))
    for key in ("requests.memory", "memory", "limits.memory"):
        if key in hard:
            assert jobs * pod <= _quantity(str(hard[key])), (key, hard, jobs, pod)


_HARD_128GI = {"requests.memory": "128Gi", "limits.memory": "128Gi"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (  # the defaults as they were: (1 + 1 surge) x 16 Jobs of up to 8Gi against 128Gi
            {
                "sandbox": {
                    "limitRange": {"max": {"memory": "8Gi"}},
                    "resourceQuota": {"hard": _HARD_128GI},
                }
            },
            "= 32 sandbox Jobs at once, 1 CPU and up to 8Gi of memory each"
            " (limitRange.max.memory 8Gi); over the quota: requests.memory 256Gi > 128Gi,"
            " limits.memory 256Gi > 128Gi.",
        ),
        (  # gVisor's pod overhead counts in the quota too; `memory` is requests.memory
            {
                "sandbox": {
                    "runtimeClass": {
                        "name": "gvisor",
                        "create": True,
                        "overhead": {"memory": "512Mi"},
                    },
                    "limitRange": {"max": {"memory": "3584Mi"}},
                    "resourceQuota": {
                        "hard": {"requests.memory": None, "memory": "120Gi", "limits.memory": None}
                    },
                }
            },
            "1 CPU and up to 4Gi of memory each (limitRange.max.memory 3584Mi + the"
            " RuntimeClass overhead 512Mi); over the quota: memory 128Gi > 120Gi.",
        ),
    ],
    ids=["default-8Gi-x-32", "gvisor-overhead"],
)
def test_a_quota_short_of_the_jobs_memory_fails_to_render(
    tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    refusal = quota_refusal(tmp_path, values)
    assert message in refusal, refusal
    assert "limitRange.max.memory" in refusal.split("Raise the quota")[-1]


def test_a_quota_that_holds_the_jobs_memory_renders() -> None:
    """32 Jobs of up to 4Gi: exactly 128Gi."""
    docs = render(
        None,
        "sandbox.limitRange.max.memory=4Gi",
        "sandbox.resourceQuota.hard.requests\\.memory=128Gi",
        "sandbox.resourceQuota.hard.limits\\.memory=128Gi",
    )
    (quota,) = objects(docs, "ResourceQuota").values()
    assert quota["spec"]["hard"]["limits.memory"] == "128Gi"
