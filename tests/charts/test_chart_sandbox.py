"""The chart's sandbox namespace: what confines the Jobs the sandbox worker creates.

The sandbox worker's Role grants only the calls infra/sandbox/kubernetes.py makes, in the
sandbox namespace; a NetworkPolicy denies all traffic of sandbox pods (matched by the labels
`build_job_manifest` puts on them); a default sandbox Job fits the namespace's LimitRange and
ResourceQuota, and so do the sandbox workers' Jobs at their largest (an over-committed quota
fails to render); and an opt-in gVisor RuntimeClass reaches the Jobs through the settings.
Rendering and validation are tests/charts/test_chart.py's. Skipped without helm.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from contracts.task import SandboxLimits
from infra.sandbox import kubernetes_job
from infra.sandbox.kubernetes import SANDBOX_LABELS, build_job_manifest, sandbox_rlimits
from infra.sandbox.kubernetes_code import build_code
from infra.sandbox.kubernetes_job import PERMISSIONS
from infra.sandbox.verifier import checker_job
from tests.charts.chart import (
    CHART,
    RELEASE_NAMESPACE,
    VALUE_SETS,
    container,
    deployments,
    needs_helm,
    objects,
    refused_values,
    render,
    settings_from,
    value_set_id,
    worker_env,
)

pytestmark = needs_helm


def _grants(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_grants_exactly_the_calls_the_backend_makes() -> None:
    """The sandbox namespace's Role grants what infra/sandbox/kubernetes.py calls there (Jobs,
    their pods and logs, the build's code ConfigMap), the release namespace's a get of a fellow worker's pod (its reaper's
    lookup): `PERMISSIONS`, nothing more (it granted unused ConfigMap, watch and pod-delete
    rights before), nothing cluster-wide, both bound to the sandbox worker's account only."""
    docs = render()
    roles = {r["metadata"]["namespace"]: r for r in objects(docs, "Role").values()}
    bindings = {b["metadata"]["namespace"]: b for b in objects(docs, "RoleBinding").values()}
    assert set(roles) == set(bindings) == {"tempered-sandbox", RELEASE_NAMESPACE}
    assert _grants(roles["tempered-sandbox"]) == PERMISSIONS["sandbox"]
    assert _grants(roles[RELEASE_NAMESPACE]) == PERMISSIONS["worker"]
    assert not objects(docs, "ClusterRole") and not objects(docs, "ClusterRoleBinding")
    for namespace, binding in bindings.items():
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": roles[namespace]["metadata"]["name"],
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "tempered-sandbox", "namespace": RELEASE_NAMESPACE}
        ]
    sandbox = deployments(docs)["sandbox"]["spec"]["template"]["spec"]
    assert sandbox["serviceAccountName"] == "tempered-sandbox"  # the reaper's lookups: its pod
    env = {e["name"]: e for e in container(deployments(docs)["sandbox"])["env"]}  # name is its id
    assert env["TEMPERED_WORKER_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    namespace = objects(docs, "Namespace")["tempered-sandbox"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"


def test_the_sandbox_role_may_read_and_create_configmaps_and_nothing_more() -> None:
    """Each build's pod code is a ConfigMap the sandbox worker creates if it is missing
    (infra/sandbox/kubernetes_code.py): a get, then a create. Immutable and named by the digest
    of its files, it is never updated, and the worker deletes none, so it may not list, watch,
    update, patch or delete any ConfigMap of the sandbox namespace; nor touch one elsewhere."""
    docs = render()
    roles = {r["metadata"]["namespace"]: r for r in objects(docs, "Role").values()}
    configmaps = [
        rule
        for role in roles.values()
        for rule in role["rules"]
        if "configmaps" in rule["resources"]
    ]
    assert configmaps == [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create"]}
    ]
    assert configmaps[0] in roles["tempered-sandbox"]["rules"]
    assert "resourceNames" not in configmaps[0]  # a create cannot be bound to names
    kubernetes_validate.validate(build_code().manifest("tempered-sandbox"), "1.33.0", strict=True)


def test_no_sandbox_rbac_without_the_sandbox_worker() -> None:
    """(A backend other than kubernetes is refused: tests/charts/test_chart_upgrade.py.)"""
    docs = render(None, "workers.sandbox.enabled=false")
    assert not objects(docs, "Role") and not objects(docs, "RoleBinding")


def _sandbox_job(runtime_class: str | None = None) -> dict[str, Any]:
    limits = SandboxLimits()
    job = checker_job("print(1)", "", "", [], None, limits, sandbox_rlimits(limits))
    return build_job_manifest(
        "tempered-sbx-1",
        "tempered-sandbox",
        "python:3.11-slim",
        job,
        limits,
        "n",
        "w",
        runtime_class,
    )


def test_network_policy_denies_all_traffic_of_sandbox_pods() -> None:
    (policy,) = objects(render(), "NetworkPolicy").values()
    spec = policy["spec"]
    assert policy["metadata"]["namespace"] == "tempered-sandbox"
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [] and spec["egress"] == []
    pod_labels = _sandbox_job()["spec"]["template"]["metadata"]["labels"]
    assert spec["podSelector"]["matchLabels"] == SANDBOX_LABELS
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()


def _quantity(text: str) -> float:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "m": 1e-3}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def test_default_sandbox_job_fits_the_namespace_limits() -> None:
    docs = render()
    (limit_range,) = objects(docs, "LimitRange").values()
    maximum = limit_range["spec"]["limits"][0]["max"]
    resources = _sandbox_job()["spec"]["template"]["spec"]["containers"][0]["resources"]
    for kind in ("cpu", "memory"):
        assert _quantity(resources["limits"][kind]) <= _quantity(maximum[kind])
    (quota,) = objects(docs, "ResourceQuota").values()
    assert _quantity(quota["spec"]["hard"]["limits.memory"]) >= _quantity(
        resources["limits"]["memory"]
    )


def test_gvisor_runtime_class_reaches_the_sandbox_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(CHART / "ci" / "gvisor-values.yaml")
    (runtime_class,) = objects(docs, "RuntimeClass").values()
    assert runtime_class["handler"] == "runsc"
    assert runtime_class["scheduling"]["nodeSelector"] == {"sandbox.gke.io/runtime": "gvisor"}
    assert runtime_class["overhead"]["podFixed"] == {"cpu": "100m", "memory": "64Mi"}
    settings = settings_from(worker_env(docs, "sandbox"), monkeypatch)
    kubernetes = settings.sandbox.kubernetes
    assert kubernetes.runtime_class == runtime_class["metadata"]["name"] == "gvisor"
    assert kubernetes.image == "registry.example.com/tempered/sandbox-python:3.11"
    job = _sandbox_job(kubernetes.runtime_class)
    assert job["spec"]["template"]["spec"]["runtimeClassName"] == "gvisor"
    assert not objects(render(), "RuntimeClass")  # opt-in


def _surge(strategy: dict[str, Any], replicas: int) -> int:
    """The pods a rolling update runs beyond `replicas` (Kubernetes' default maxSurge: 25%,
    rounded up)."""
    if strategy.get("type") == "Recreate":
        return 0
    surge = str(strategy.get("rollingUpdate", {}).get("maxSurge", "25%"))
    return math.ceil(replicas * int(surge[:-1]) / 100) if surge.endswith("%") else int(surge)


def sandbox_jobs_at_most(docs: Any) -> int:
    """The Jobs the sandbox workers run at once at their largest: (max) replicas, plus a
    rolling update's surge, x concurrency."""
    autoscaled = [
        obj["spec"].get("maxReplicas", obj["spec"].get("maxReplicaCount"))
        for kind in ("HorizontalPodAutoscaler", "ScaledObject")
        for obj in objects(docs, kind).values()
        if obj["spec"]["scaleTargetRef"]["name"] == "tempered-sandbox"
    ]
    deployment = deployments(docs)["sandbox"]
    replicas = max(autoscaled) if autoscaled else deployment["spec"]["replicas"]
    replicas += _surge(deployment["spec"]["strategy"], replicas)
    return int(replicas * int(worker_env(docs, "sandbox")["TEMPERED_SANDBOX__CONCURRENCY"]))


def quota_refusal(directory: Path, values: dict[str, Any]) -> str:
    """helm's refusal of `values` whose sandbox Jobs at most (sandbox_jobs_at_most) overrun the
    quota (this file's and test_chart_sandbox_bounds.py's cases)."""
    refusal = refused_values(directory, values)
    assert "sandbox.resourceQuota.hard is too small for the sandbox workers" in refusal, refusal
    return refusal


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_sandbox_jobs_at_most_replicas_fit_the_quota(values: Path | None) -> None:
    """The sandbox workers at their largest run (max) replicas, plus a rolling update's surge,
    x concurrency Jobs at once, each one pod of the CPU `build_job_manifest` asks for plus the
    RuntimeClass's overhead; a Job over the quota is refused. Checked here from the rendered
    objects, apart from the chart's own check (tempered.checkSandboxQuota)."""
    docs = render(values)
    quota = [q["spec"]["hard"] for q in objects(docs, "ResourceQuota").values()]
    if not quota or "sandbox" not in deployments(docs):
        return
    (hard,) = quota
    jobs = sandbox_jobs_at_most(docs)
    pod = _sandbox_job()["spec"]["template"]["spec"]
    cpu = sum(_quantity(c["resources"]["requests"]["cpu"]) for c in pod["containers"])
    for runtime_class in objects(docs, "RuntimeClass").values():
        cpu += _quantity(runtime_class.get("overhead", {}).get("podFixed", {}).get("cpu", "0"))
    for key in ("pods", "count/jobs.batch"):
        assert jobs <= _quantity(str(hard.get(key, jobs))), (key, hard, jobs)
    for key in ("requests.cpu", "limits.cpu"):
        assert jobs * cpu <= _quantity(str(hard.get(key, jobs * cpu))) + 1e-9, (key, hard, jobs)


_GVISOR_3_X_64 = {  # ci/gvisor-values.yaml as it was: 3 x 64 Jobs of 1.1 CPU, quota of 128
    "sandbox": {
        "concurrency": 64,
        "runtimeClass": {"name": "gvisor", "create": True, "overhead": {"cpu": "100m"}},
        "limitRange": {"max": {"memory": "1Gi"}},  # 192Gi at most: within the quota's memory
        "resourceQuota": {"hard": {"pods": "128", "requests.cpu": "128", "limits.cpu": "128"}},
    },
    "workers": {"sandbox": {"replicas": 3, "strategy": {"type": "Recreate"}}},
}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            _GVISOR_3_X_64,
            "3 replicas (workers.sandbox.replicas) x sandbox.concurrency 64 = 192 sandbox Jobs"
            " at once, 1.1 CPU and up to 1Gi of memory each (a Job's 1 CPU + the RuntimeClass"
            " overhead 100m; limitRange.max.memory 1Gi); over the quota: pods 192 > 128,"
            " count/jobs.batch 192 > 128, requests.cpu 211.2 > 128, limits.cpu 211.2 > 128.",
        ),
        (  # the pods and Jobs fit; their CPU with gVisor's overhead does not
            {
                **_GVISOR_3_X_64,
                "workers": {"sandbox": {"replicas": 2, "strategy": {"type": "Recreate"}}},
            },
            "= 128 sandbox Jobs at once, 1.1 CPU and up to 1Gi of memory each (a Job's 1 CPU +"
            " the RuntimeClass overhead 100m; limitRange.max.memory 1Gi); over the quota:"
            " requests.cpu 140.8 > 128, limits.cpu 140.8 > 128.",
        ),
        (  # KEDA's default 8 replicas (+ 25% surge) x 16 against the default quota's 64 pods
            {"workers": {"sandbox": {"keda": {"enabled": True, "maxReplicas": 8}}}},
            "8 replicas (workers.sandbox keda.maxReplicas) + 2 surge (strategy.rollingUpdate"
            ".maxSurge 25%) x sandbox.concurrency 16 = 160 sandbox Jobs at once, 1 CPU and up"
            " to 8Gi of memory each (limitRange.max.memory 8Gi); over the quota: pods 160 > 64,"
            " count/jobs.batch 160 > 128, requests.cpu 160 > 64, limits.cpu 160 > 64,"
            " requests.memory 1280Gi > 512Gi, limits.memory 1280Gi > 512Gi.",
        ),
        (  # 4 x 16 is the quota's 64 pods; a rolling update runs a fifth pod beside them
            {"workers": {"sandbox": {"replicas": 4}}},
            "4 replicas (workers.sandbox.replicas) + 1 surge (strategy.rollingUpdate.maxSurge"
            " 25%) x sandbox.concurrency 16 = 80 sandbox Jobs at once, 1 CPU and up to 8Gi of"
            " memory each (limitRange.max.memory 8Gi); over the quota: pods 80 > 64,"
            " requests.cpu 80 > 64, limits.cpu 80 > 64, requests.memory 640Gi > 512Gi,"
            " limits.memory 640Gi > 512Gi.",
        ),
        (
            {
                "workers": {
                    "sandbox": {
                        "replicas": 2,
                        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 3}},
                    }
                }
            },
            "2 replicas (workers.sandbox.replicas) + 3 surge (strategy.rollingUpdate.maxSurge"
            " 3) x sandbox.concurrency 16 = 80 sandbox Jobs at once",
        ),
    ],
    ids=["gvisor-3x64", "gvisor-cpu-only", "keda-8x16", "surge-4x16", "surge-3"],
)
def test_an_overcommitted_sandbox_quota_fails_to_render(
    tmp_path: Path, values: dict[str, Any], message: str
) -> None:
    refusal = quota_refusal(tmp_path, values)
    assert message in refusal, refusal


def test_the_docs_say_which_tasks_the_limit_range_admits() -> None:
    """limitRange.max (8Gi by default) refuses the pods of tasks the contract allows (memory_mb
    up to 65536): the README and values.yaml give the pod's size as `build_job_manifest`
    computes it, so an operator can tell which limits a LimitRange admits."""
    limits = SandboxLimits(memory_mb=1000, tmpfs_mb=100)
    extra = kubernetes_job.pod_memory_mb(limits) - limits.memory_mb - limits.tmpfs_mb
    runtime = kubernetes_job.pod_memory_mb(limits, "gvisor") - kubernetes_job.pod_memory_mb(limits)
    formula = f"`memory_mb + tmpfs_mb + {extra}Mi` ({runtime}Mi more under a RuntimeClass)"
    assert formula in " ".join((CHART / "README.md").read_text().split())
    values = " ".join(w for w in (CHART / "values.yaml").read_text().split() if w != "#")
    assert f"memory_mb + tmpfs_mb + {extra}Mi" in values
    maximum = render_limit_range_max_mb()
    largest = maximum - extra - SandboxLimits().tmpfs_mb
    assert f"memory_mb of {largest} at most with the default tmpfs_mb" in values


def render_limit_range_max_mb() -> int:
    (limit_range,) = objects(render(), "LimitRange").values()
    return int(_quantity(limit_range["spec"]["limits"][0]["max"]["memory"]) // 2**20)
