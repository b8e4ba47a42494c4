"""The Helm chart: lint, render, validate for Kubernetes 1.33, and check what matters.

Needs the helm binary (`scripts/install-helm.sh` puts it in .tempered/bin; the Makefile's setup
runs it); skipped with that hint when it is missing. Rendered objects are validated with
kubernetes-validate (strict, 1.33) except CRD kinds it has no schema for (CRD_KINDS), which get
a structural check here instead.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel

from contracts.task import SandboxLimits
from infra.sandbox.kubernetes import SANDBOX_LABELS, build_job_manifest, sandbox_rlimits
from infra.sandbox.verifier import checker_job
from infra.settings import Settings
from infra.telemetry import PORT_OFFSETS, SDK_PORT_SHIFT, prometheus_port_for
from tests.paths import REPO_ROOT

CHART = REPO_ROOT / "charts" / "tempered"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
VALUE_SETS = [None, *CI_VALUES]
RELEASE_NAMESPACE = "tempered"
KUBERNETES_VERSION = "1.33.0"
CRD_KINDS = {("keda.sh/v1alpha1", "ScaledObject")}
"""Kinds kubernetes-validate has no schema for; checked structurally in test_keda_*."""
WORKERS = ["agent-tasks", "inference", "sandbox", "rewards", "learner"]


def _helm() -> str | None:
    for candidate in (
        shutil.which("helm"),
        os.environ.get("TEMPERED_HOME", "") + "/bin/helm",
        str(REPO_ROOT / ".tempered" / "bin" / "helm"),
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


HELM = _helm()
pytestmark = pytest.mark.skipif(
    HELM is None, reason="helm not installed: run scripts/install-helm.sh"
)


def _ids(values: Path | None) -> str:
    return "default" if values is None else values.name


def _helm_run(*args: str) -> str:
    assert HELM is not None
    done = subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@functools.cache
def render(values: Path | None = None, *sets: str) -> list[dict[str, Any]]:
    args = ["template", "tempered", str(CHART), "--namespace", RELEASE_NAMESPACE]
    args += ["-f", str(values)] if values else []
    for item in sets:
        args += ["--set", item]
    return [doc for doc in yaml.safe_load_all(_helm_run(*args)) if doc]


def objects(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def deployments(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Deployments by queue."""
    return {
        d["metadata"]["labels"]["tempered.dev/queue"]: d
        for d in objects(docs, "Deployment").values()
    }


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def worker_env(docs: list[dict[str, Any]], queue: str) -> dict[str, str]:
    """The TEMPERED_* environment a worker process sees (ConfigMap, Secret, its own env)."""
    env: dict[str, str] = {}
    for source in container(deployments(docs)[queue])["envFrom"]:
        if "configMapRef" in source:
            env.update(objects(docs, "ConfigMap")[source["configMapRef"]["name"]]["data"])
        secret = objects(docs, "Secret").get(source.get("secretRef", {}).get("name", ""))
        if secret:
            env.update(secret["stringData"])
    env.update(
        {e["name"]: e["value"] for e in container(deployments(docs)[queue])["env"] if "value" in e}
    )
    return env


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name in [n for n in os.environ if n.startswith("TEMPERED_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(CHART)  # no tempered.toml here
    return Settings()


def names_a_field(env_name: str) -> bool:
    """Whether TEMPERED_A__B__C is the field a.b.c of the settings model (a typo is silent)."""
    model: type[BaseModel] = Settings
    *sections, leaf = env_name.removeprefix("TEMPERED_").lower().split("__")
    for name in sections:
        field = model.model_fields.get(name)
        if field is None or not (
            isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
        ):
            return False
        model = field.annotation
    return leaf in model.model_fields


@pytest.mark.parametrize("values", VALUE_SETS, ids=_ids)
def test_helm_lint_strict(values: Path | None) -> None:
    _helm_run("lint", "--strict", str(CHART), *(["-f", str(values)] if values else []))


def test_values_schema_rejects_a_misspelt_worker_key() -> None:
    assert HELM is not None
    done = subprocess.run(
        [HELM, "lint", "--strict", str(CHART), "--set", "workers.sandbox.replica=2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "replica" in done.stdout + done.stderr


@pytest.mark.parametrize("values", VALUE_SETS, ids=_ids)
def test_every_rendered_object_validates_for_1_33(values: Path | None) -> None:
    docs = render(values)
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]


@pytest.mark.parametrize("values", VALUE_SETS, ids=_ids)
def test_settings_env_is_the_settings_model(
    values: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(values)
    for queue, deployment in deployments(docs).items():
        env = worker_env(docs, queue)
        assert [name for name in env if not names_a_field(name)] == []
        settings = settings_from(env, monkeypatch)
        assert settings.sandbox.kubernetes.namespace == "tempered-sandbox"
        assert container(deployment)["args"] == ["worker", queue]
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        port = prometheus_port_for(settings, queue)
        assert (
            int(annotations["prometheus.io/port"]) if "prometheus.io/port" in annotations else None
        ) == port
        if port is not None:
            ports = {p["name"]: p["containerPort"] for p in container(deployment)["ports"]}
            assert ports == {"metrics": port, "sdk-metrics": port + SDK_PORT_SHIFT}
            assert settings.telemetry.prometheus_host == "0.0.0.0"  # type: ignore[attr-defined]


def test_one_deployment_per_worker_and_only_the_sandbox_holds_a_token() -> None:
    docs = render()
    found = deployments(docs)
    assert sorted(found) == sorted(WORKERS) == sorted(PORT_OFFSETS)
    for queue, deployment in found.items():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container(deployment)["securityContext"]["readOnlyRootFilesystem"] is True
        assert pod["automountServiceAccountToken"] is (queue == "sandbox")
        assert pod["serviceAccountName"] == (
            "tempered-sandbox" if queue == "sandbox" else "tempered-worker"
        )
    assert found["learner"]["spec"]["strategy"] == {"type": "Recreate"}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (None, {"inference": "1", "learner": "1"}),
        (CHART / "ci" / "gpu-values.yaml", {"inference": "1", "learner": "8"}),
        (CHART / "ci" / "cpu-values.yaml", {}),
    ],
    ids=["default", "gpu", "cpu"],
)
def test_gpu_requests_on_inference_and_learner(
    values: Path | None, expected: dict[str, str]
) -> None:
    for queue, deployment in deployments(render(values)).items():
        resources = container(deployment)["resources"]
        gpus = {resources.get(k, {}).get("nvidia.com/gpu") for k in ("requests", "limits")}
        assert gpus == {expected.get(queue)}, (queue, resources)


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


def test_per_worker_overrides_merge_over_defaults() -> None:
    docs = render(CHART / "ci" / "overrides-values.yaml")
    found = deployments(docs)
    assert sorted(found) == ["agent-tasks", "inference", "rewards", "sandbox"]  # learner disabled
    hpas = {
        h["spec"]["scaleTargetRef"]["name"]: h
        for h in objects(docs, "HorizontalPodAutoscaler").values()
    }
    assert sorted(hpas) == ["tempered-agent-tasks", "tempered-inference", "tempered-sandbox"]
    assert found["rewards"]["spec"]["replicas"] == 0  # `false` and `0` override the defaults
    assert "replicas" not in found["sandbox"]["spec"]  # the HPA owns it
    sandbox = container(found["sandbox"])["resources"]
    assert sandbox["requests"] == {"cpu": "3", "memory": "512Mi"}  # one key overridden, one kept
    assert sandbox["limits"] == {"memory": "1Gi"}
    assert "limits" not in container(found["agent-tasks"])["resources"]  # null removes
    assert found["agent-tasks"]["spec"]["template"]["spec"]["nodeSelector"] == {
        "kubernetes.io/os": "linux"
    }
    metrics = {
        m["resource"]["name"]: m["resource"]["target"]["averageUtilization"]
        for m in hpas["tempered-sandbox"]["spec"]["metrics"]
    }
    assert (
        metrics == {"cpu": 70, "memory": 80}
        and hpas["tempered-sandbox"]["spec"]["maxReplicas"] == 6
    )
    assert not objects(docs, "Secret")  # existingSecret is used instead
    assert {"secretRef": {"name": "tempered-s3-credentials"}} in container(found["rewards"])[
        "envFrom"
    ]


def test_keda_scales_activity_workers_on_their_task_queue() -> None:
    docs = render(CHART / "ci" / "keda-values.yaml")
    scaled = {
        s["spec"]["scaleTargetRef"]["name"]: s for s in objects(docs, "ScaledObject").values()
    }
    assert sorted(scaled) == ["tempered-inference", "tempered-rewards", "tempered-sandbox"]
    hpa_targets = {
        h["spec"]["scaleTargetRef"]["name"]
        for h in objects(docs, "HorizontalPodAutoscaler").values()
    }
    assert hpa_targets == {
        "tempered-agent-tasks"
    }  # never an HPA and a ScaledObject on one Deployment
    found = deployments(docs)
    for name, obj in scaled.items():
        assert obj["apiVersion"] == "keda.sh/v1alpha1"
        spec = obj["spec"]
        assert spec["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": name,
        }
        queue = name.removeprefix("tempered-")
        assert "replicas" not in found[queue]["spec"]
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "temporal"
        assert (
            trigger["metadata"]["taskQueue"] == queue
            and trigger["metadata"]["queueTypes"] == "activity"
        )
        assert (
            trigger["metadata"]["endpoint"] == "temporal-frontend.temporal.svc.cluster.local:7233"
        )
        assert all(isinstance(v, str) for v in trigger["metadata"].values())  # KEDA wants strings
        assert 0 <= spec["minReplicaCount"] < spec["maxReplicaCount"]
    assert scaled["tempered-sandbox"]["spec"]["triggers"][0]["metadata"]["targetQueueSize"] == "32"


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


def test_the_chart_runs_the_images_own_user() -> None:
    """The image's user (the Dockerfile's own checks live in tests/test_packaging.py)."""
    assert "\nUSER 10001:10001" in (REPO_ROOT / "Dockerfile").read_text()
    for deployment in deployments(render()).values():
        assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 10001


def test_agent_tasks_is_versioned_and_scales_on_its_builds_backlog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    docs = render(None, "workers.agent-tasks.keda.enabled=true", "image.tag=2.3.4")
    temporal = settings_from(worker_env(docs, "agent-tasks"), monkeypatch).temporal
    assert (temporal.versioning, temporal.deployment, temporal.build_id) == (
        "pinned",
        "tempered",
        "2.3.4",  # the image tag names the build
    )
    (scaled,) = [
        s for s in objects(docs, "ScaledObject").values() if "agent-tasks" in s["metadata"]["name"]
    ]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["metadata"]["queueTypes"] == "workflow"
    assert trigger["metadata"]["workerDeploymentName"] == "tempered"
    assert trigger["metadata"]["workerDeploymentBuildId"] == "2.3.4"
    unversioned = render(None, "workers.agent-tasks.keda.enabled=true", "temporal.versioning=off")
    (scaled,) = [s for s in objects(unversioned, "ScaledObject").values()]
    assert "workerDeploymentName" not in scaled["spec"]["triggers"][0]["metadata"]
