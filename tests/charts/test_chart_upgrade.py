"""The chart through an upgrade: a side release of the old agent-tasks build beside the new
release, rollouts that wait for a slow start, settings that restart only their worker, and the
values the chart refuses (a sandbox backend no pod could run, missing S3 credentials, a
Kubernetes older than the fields it renders). Skipped without helm.
"""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from contracts.errors import ErrorType
from tests.charts.chart import (
    CHART,
    VALUE_SETS,
    container,
    deployments,
    helm_refusal,
    needs_helm,
    refused,
    render,
    value_set_id,
)
from tests.charts.test_chart_probes import window_s

pytestmark = needs_helm

SIDE_RELEASE = (
    "workers.inference.enabled=false",
    "workers.sandbox.enabled=false",
    "workers.rewards.enabled=false",
    "workers.learner.enabled=false",
    "temporal.promote=false",
    "sandbox.createNamespace=false",
)
"""The old build's agent-tasks worker as a release of its own (charts/tempered/README.md)."""


def test_a_side_release_of_agent_tasks_renders_nothing_of_the_sandbox_namespace() -> None:
    """A second release rendered the sandbox Namespace, quota, limits, network policy and RBAC
    again, which Helm refuses to take over from the first release."""
    docs = render(None, *SIDE_RELEASE)
    assert list(deployments(docs)) == ["agent-tasks"]
    assert {d["kind"] for d in docs} == {"ConfigMap", "Secret", "ServiceAccount", "Deployment"}
    assert not [d for d in docs if d["metadata"].get("namespace") == "tempered-sandbox"]


def test_the_upgrade_section_gives_the_side_release_and_the_snapshot_format_step() -> None:
    readme = (CHART / "README.md").read_text()
    upgrading = readme[readme.index("## Upgrading") :]
    upgrading = upgrading[: upgrading.index("\n## ", 1)]
    for item in SIDE_RELEASE:
        assert item in upgrading, item
    for text in (
        "workers.sandbox.env.TEMPERED_SANDBOX__WORKSPACES__SNAPSHOT_FORMAT=1",
        "--versioning-override-behavior auto_upgrade",
        "helm upgrade",
        "--wait --timeout 25m",
    ):
        assert text in upgrading, text


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_a_rollout_is_not_failed_before_its_pods_may_start(values: Path | None) -> None:
    """progressDeadlineSeconds defaulted to 600 s, and inference may take 1200 s to be ready:
    `helm upgrade --wait` and `kubectl rollout status` reported a healthy rollout failed."""
    for name, deployment in deployments(render(values)).items():
        startup = window_s(container(deployment)["startupProbe"])
        assert deployment["spec"].get("progressDeadlineSeconds", 600) >= startup + 300, name


def test_the_inference_strategy_may_take_no_spare_gpu() -> None:
    docs = render(CHART / "ci" / "gpu-values.yaml")
    strategy = deployments(docs)["inference"]["spec"]["strategy"]
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_a_worker_env_setting_restarts_only_that_worker() -> None:
    """`settings:` restarts every worker (one ConfigMap for all five); a worker's own `env:`
    restarts that worker only, which is where a worker-specific setting goes."""
    before = deployments(render())
    after = deployments(
        render(None, "workers.sandbox.env.TEMPERED_SANDBOX__WORKSPACES__SNAPSHOT_FORMAT=1")
    )
    changed = {name for name in before if before[name]["spec"] != after[name]["spec"]}
    assert changed == {"sandbox"}
    readme = " ".join((CHART / "README.md").read_text().split())
    assert "`settings:` restarts every worker" in readme


@pytest.mark.parametrize("backend", ["local", "gvisor"])
def test_a_sandbox_backend_no_pod_could_run_is_refused(backend: str) -> None:
    """uid 10001 with every capability dropped can run no program under `local` or `gvisor`."""
    refusal = refused(f"sandbox.backend={backend}")
    assert "backend" in refusal and "must be 'kubernetes'" in refusal


def test_s3_credentials_are_required_without_an_existing_secret() -> None:
    """values.yaml shipped working credentials (tempered/tempered-secret) into a Secret."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert not values["s3"]["accessKey"] and not values["s3"]["secretKey"]
    refusal = helm_refusal("template", "tempered", str(CHART), "-f", str(CHART / "values.yaml"))
    assert "s3.accessKey is required" in refusal


def test_the_kube_version_admits_only_clusters_with_every_rendered_field() -> None:
    """appArmorProfile (workspace sessions) is Kubernetes 1.30's; the chart said 1.29."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    (minor,) = re.findall(r"^>=1\.(\d+)\.0-0$", chart["kubeVersion"])
    docs = render(CHART / "ci" / "workspace-sessions-values.yaml")
    for doc in docs:
        if doc["apiVersion"].startswith("keda.sh/"):
            continue
        kubernetes_validate.validate(doc, f"1.{minor}.0", strict=True)


def test_the_docs_name_the_error_the_sandbox_worker_raises() -> None:
    schema = (CHART / "values.schema.json").read_text()
    assert ErrorType.SESSIONS_UNAVAILABLE.value in schema
    assert ErrorType.SANDBOX_MISCONFIGURED.value not in schema
    readme = " ".join((CHART / "README.md").read_text().split())
    assert "launcher and the verifier's modules in the pod's spec" not in readme
