"""The chart's values against what the code reads: torch devices, the build id, the names and
numbers of `settings:`, the schema's refusals, pod restarts on a changed Secret, strategies.

Each test renders the chart (or lints it) and reads the result as the workers would: through
the settings model (infra/settings.py) or workers/versioning.py. Rendering, strict 1.33
validation and lint of every value set are tests/charts/test_chart.py's. Skipped without helm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts.chart import (
    CREDENTIAL_VALUES,
    VALUE_SETS,
    container,
    deployments,
    lint_refused,
    needs_helm,
    objects,
    refused,
    render,
    settings_from,
    value_set_id,
    worker_env,
)
from workers.versioning import build_id, workflow_code_digest

pytestmark = needs_helm


def gpus(deployment: dict[str, Any]) -> int:
    """The GPUs a worker's pod is limited to."""
    return int(container(deployment)["resources"].get("limits", {}).get("nvidia.com/gpu", 0))


def devices(docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The torch device of the inference (local backend) and learner workers rendered."""
    found: dict[str, str] = {}
    for queue in ("inference", "learner"):
        if queue in deployments(docs):
            settings = settings_from(worker_env(docs, queue), monkeypatch)
            found[queue] = (
                settings.inference.local.device if queue == "inference" else settings.learner.device
            )
    return found


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
def test_a_worker_without_gpus_runs_torch_on_the_cpu(
    values: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gpu: 0` once kept values.yaml's `cuda`: torch then failed at start on a GPU-less pod."""
    docs = render(values)
    found = devices(docs, monkeypatch)
    assert found or list(deployments(docs)) == ["agent-tasks"]  # all but a side release
    for queue, device in found.items():
        assert device == ("cuda" if gpus(deployments(docs)[queue]) else "cpu"), queue
        names = [e["name"] for e in container(deployments(docs)[queue])["env"]]
        assert len(names) == len(set(names)), names  # a device in env is not rendered twice


def test_a_device_set_in_env_or_settings_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(
        None,
        "workers.inference.gpu=0",
        "workers.inference.env.TEMPERED_INFERENCE__LOCAL__DEVICE=cuda:1",
        "settings.TEMPERED_LEARNER__DEVICE=cpu",
    )
    assert gpus(deployments(docs)["learner"]) == 1
    assert devices(docs, monkeypatch) == {"inference": "cuda:1", "learner": "cpu"}


def test_the_build_id_is_the_workflow_codes_digest_unless_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The image tag once named the build: every image bump was a new pinned build, and the
    rolling update stranded the running workflows of the old one, workflow code changed or not."""
    default = worker_env(render(None, "image.tag=2.3.4"), "agent-tasks")
    assert "TEMPERED_TEMPORAL__BUILD_ID" not in default
    assert build_id(settings_from(default, monkeypatch)) == workflow_code_digest()
    named = worker_env(render(None, "temporal.buildId=b7"), "agent-tasks")
    assert build_id(settings_from(named, monkeypatch)) == "b7"


def test_keda_on_the_versioned_agent_tasks_needs_a_build_id() -> None:
    """KEDA reads the backlog of one build, and only the worker knows its digest."""
    assert "temporal.buildId" in refused("workers.agent-tasks.keda.enabled=true")


def test_helm_refuses_a_misspelt_settings_name() -> None:
    """The names are the model's (tests/charts/test_chart_fix60_settings_names.py)."""
    refusal = lint_refused("settings.TEMPERED_SANDBOX_CONCURRENCY=64")
    assert "TEMPERED_SANDBOX_CONCURRENCY" in refusal


def test_large_numbers_reach_the_workers_as_numbers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A values file's numbers are floats to helm, and a float >= 1e6 once rendered as
    "1e+06", which an int field refuses: the worker failed at start."""
    values = tmp_path / "numbers-values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                **CREDENTIAL_VALUES,
                "settings": {
                    "TEMPERED_OMP_SPIN_COUNT": 1000000,
                    "TEMPERED_INFERENCE__POLICY_WAIT_S": 1.5,
                    "TEMPERED_INFERENCE__VLLM__ENFORCE_EAGER": False,
                },
                "workers": {
                    "inference": {"env": {"TEMPERED_INFERENCE__LOCAL__PREFIX_CACHE_MIB": 1048576}},
                    "rewards": {"keda": {"enabled": True, "targetQueueSize": 2000000}},
                },
            }
        )
    )
    docs = render(values)
    settings = settings_from(worker_env(docs, "inference"), monkeypatch)
    assert settings.omp_spin_count == 1000000
    assert settings.inference.local.prefix_cache_mib == 1048576
    assert settings.inference.policy_wait_s == 1.5
    assert settings.inference.vllm.enforce_eager is False
    (scaled,) = objects(docs, "ScaledObject").values()
    assert scaled["spec"]["triggers"][0]["metadata"]["targetQueueSize"] == "2000000"


@pytest.mark.parametrize(
    "item",
    [
        "s3.endpoint=",  # AWS's default endpoint to the worker; the chart asks for the URL
        "workers.sandbox.queue=rewards",  # a metrics port and a quota check of another queue
        "defaults.queue=inference",
        "defaults.stateDirSizeLimit=10GB",  # an emptyDir's sizeLimit the API server refuses
        "workers.learner.stateDirSizeLimit=",
    ],
)
def test_the_schema_refuses(item: str) -> None:
    key = item.split("=")[0].rsplit(".", 1)[-1]
    assert key in lint_refused(item)


def test_a_changed_s3_secret_restarts_the_pods() -> None:
    """The pod template names the chart's Secret by a digest of its content (an existing
    Secret by its own name: tests/charts/test_chart_settings_rollout.py)."""
    before = deployments(render(None, "s3.secretKey=one"))
    after = deployments(render(None, "s3.secretKey=two"))
    for queue, deployment in before.items():
        assert deployment["spec"]["template"] != after[queue]["spec"]["template"], queue


def test_a_recreated_worker_takes_no_rolling_update_settings() -> None:
    """defaults.strategy.rollingUpdate merged into the learner's Recreate once rendered a
    Deployment the API server refuses."""
    found = deployments(render(None, "defaults.strategy.rollingUpdate.maxUnavailable=0"))
    assert found["learner"]["spec"]["strategy"] == {"type": "Recreate"}
    assert found["rewards"]["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0},
    }
