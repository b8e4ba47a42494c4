"""The chart's sandbox namespace: what confines the Jobs the sandbox worker creates.

The sandbox worker's Role grants only the calls infra/sandbox/kubernetes.py makes, in the
sandbox namespace; a NetworkPolicy denies all traffic of sandbox pods (matched by the labels
`build_job_manifest` puts on them); a default sandbox Job fits the namespace's LimitRange and
ResourceQuota; and an opt-in gVisor RuntimeClass reaches the Jobs through the settings.
Rendering and validation are tests/charts/test_chart.py's. Skipped without helm.
"""

from __future__ import annotations

from typing import Any

import pytest

from contracts.task import SandboxLimits
from infra.sandbox.kubernetes import SANDBOX_LABELS, build_job_manifest, sandbox_rlimits
from infra.sandbox.verifier import checker_job
from tests.charts.chart import (
    CHART,
    RELEASE_NAMESPACE,
    needs_helm,
    objects,
    render,
    settings_from,
    worker_env,
)

pytestmark = needs_helm


def test_rbac_is_scoped_to_the_sandbox_namespace() -> None:
    docs = render()
    (role,) = objects(docs, "Role").values()
    (binding,) = objects(docs, "RoleBinding").values()
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "tempered-sandbox"
    granted = {
        (res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]
    }
    # every call infra/sandbox/kubernetes.py makes, and nothing cluster-wide or secret-related
    needed = {
        ("jobs", "create"),
        ("jobs", "list"),
        ("jobs", "delete"),
        ("pods", "list"),
        ("pods/log", "get"),
    }
    assert needed <= granted
    assert not any(
        res in ("secrets", "*") or verb in ("*", "escalate", "bind", "impersonate")
        for res, verb in granted
    )
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "tempered-sandbox", "namespace": RELEASE_NAMESPACE}
    ]
    namespace = objects(docs, "Namespace")["tempered-sandbox"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "baseline"


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
