"""The Helm chart: lint, render, validate for Kubernetes 1.33, and check the workers.

Rendered objects are validated with kubernetes-validate (strict, 1.33) except CRD kinds it has
no schema for (CRD_KINDS), which get a structural check here instead. What the workers see is
checked against the settings model: their environment, ports, GPUs, per-worker overrides,
autoscaling (HPA or KEDA) and Worker Versioning. The sandbox namespace (RBAC, network policy,
limits, gVisor) is tests/charts/test_chart_sandbox.py's; the learner's ranks and /dev/shm are
tests/charts/test_learner_chart.py's; devices, the build id, the names and numbers of
`settings:` and the schema's refusals are tests/charts/test_chart_values.py's. Skipped without
helm (see tests/charts/chart.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel

from infra.settings import Settings
from infra.telemetry import PORT_OFFSETS, SDK_PORT_SHIFT, prometheus_port_for
from tests.charts.chart import (
    CHART,
    VALUE_SETS,
    WORKERS,
    container,
    deployments,
    helm_run,
    lint_refused,
    needs_helm,
    objects,
    refused,
    render,
    settings_from,
    value_set_id,
    worker_env,
)
from tests.paths import REPO_ROOT

pytestmark = needs_helm

KUBERNETES_VERSION = "1.33.0"
CRD_KINDS = {("keda.sh/v1alpha1", "ScaledObject")}
"""Kinds kubernetes-validate has no schema for; checked structurally in test_keda_*."""


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


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_helm_lint_strict(values: Path | None) -> None:
    helm_run("lint", "--strict", str(CHART), *(["-f", str(values)] if values else []))


def test_values_schema_rejects_a_misspelt_worker_key() -> None:
    assert "replica" in lint_refused("workers.sandbox.replica=2")


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_every_rendered_object_validates_for_1_33(values: Path | None) -> None:
    docs = render(values)
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    assert not [d for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding")]


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
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
        annotations = deployment["spec"]["template"]["metadata"].get("annotations", {})
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


def test_keda_keeps_one_replica_of_busy_activity_workers_unless_told_zero() -> None:
    """The trigger is the backlog only: a worker busy with the activities it picked up has none,
    and scaling it to zero would cancel them. So keda.minReplicas defaults to 1; 0 stays allowed
    when set explicitly."""

    def min_replicas(docs: list[dict[str, Any]]) -> dict[str, int]:
        return {
            s["metadata"]["labels"]["tempered.dev/queue"]: s["spec"]["minReplicaCount"]
            for s in objects(docs, "ScaledObject").values()
        }

    keda = CHART / "ci" / "keda-values.yaml"
    assert min_replicas(render(keda)) == {"inference": 1, "rewards": 1, "sandbox": 1}
    explicit = render(keda, "workers.rewards.keda.minReplicas=0")
    assert min_replicas(explicit) == {"inference": 1, "rewards": 0, "sandbox": 1}


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["autoscaling.enabled=true", "autoscaling.minReplicas=5", "autoscaling.maxReplicas=2"],
            "workers.rewards: autoscaling.minReplicas 5 is above autoscaling.maxReplicas 2",
        ),
        (
            ["keda.enabled=true", "keda.minReplicas=9"],
            "workers.rewards: keda.minReplicas 9 is above keda.maxReplicas 8",
        ),
        (  # an HPA with no metrics scales on 80% CPU, which no value said
            ["autoscaling.enabled=true", "autoscaling.targetCPUUtilizationPercentage=0"],
            "workers.rewards: autoscaling has no target: set"
            " autoscaling.targetCPUUtilizationPercentage or targetMemoryUtilizationPercentage",
        ),
    ],
    ids=["hpa-min-above-max", "keda-min-above-max", "hpa-without-targets"],
)
def test_an_autoscaler_the_cluster_would_refuse_fails_to_render(
    sets: list[str], message: str
) -> None:
    """The schema cannot compare two values: these rendered, and the API server (HPA) or KEDA's
    webhook refused them at install, or the HPA scaled on what no value said."""
    assert message in refused(*(f"workers.rewards.{item}" for item in sets))


def _worker_object_names(docs: list[dict[str, Any]]) -> list[str]:
    return [
        d["metadata"]["name"]
        for d in docs
        if d["kind"] in ("Deployment", "HorizontalPodAutoscaler", "ScaledObject")
    ]


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_every_object_has_a_name_of_its_own(values: Path | None) -> None:
    """ci/long-name-values.yaml's fullname is as long as a 53-character release name makes it:
    cut to 63 characters before the queue was added, all five Deployments had one name."""
    docs = render(values)
    found = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(found) == len(set(found)), sorted(found)
    assert [n for n in _worker_object_names(docs) if len(n) > 63] == []


def test_a_release_name_of_helms_longest_keeps_each_workers_name() -> None:
    release = "r" * 53  # helm's longest
    rendered = helm_run(
        "template", release, str(CHART), "--set", "workers.rewards.keda.enabled=true"
    )
    docs = [doc for doc in yaml.safe_load_all(rendered) if doc]
    names = _worker_object_names(docs)
    assert len(names) == 6 and all(len(n) <= 63 for n in names), names
    prefixes = {d["metadata"]["name"].removesuffix(f"-{q}") for q, d in deployments(docs).items()}
    assert len(prefixes) == 1, names  # the queue is kept whole, after one shortened fullname
    assert sorted(set(names)) == sorted(deployments(docs)[q]["metadata"]["name"] for q in WORKERS)


def test_the_chart_runs_the_images_own_user() -> None:
    """The image's user (the Dockerfile's own checks live in tests/test_packaging.py)."""
    assert "\nUSER 10001:10001" in (REPO_ROOT / "Dockerfile").read_text()
    for deployment in deployments(render()).values():
        assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 10001


def test_agent_tasks_is_versioned_and_scales_on_its_builds_backlog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    docs = render(None, "workers.agent-tasks.keda.enabled=true", "temporal.buildId=2.3.4")
    temporal = settings_from(worker_env(docs, "agent-tasks"), monkeypatch).temporal
    assert (temporal.versioning, temporal.deployment, temporal.build_id) == (
        "pinned",
        "tempered",
        "2.3.4",  # KEDA's build is the worker's (without it, test_chart_values.py)
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
