"""The chart's learner: one DeepSpeed rank per GPU it requests, a /dev/shm for NCCL, and never
more than one replica.

Rendering, strict 1.33 validation and lint of every value set are tests/charts/test_chart.py's;
this checks what the learner's pod tells the worker (settings.learner.ranks), what it mounts, and
that values asking for a second learner fail to render.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.charts.chart import (
    CHART,
    container,
    deployments,
    needs_helm,
    refused,
    render,
    settings_from,
    worker_env,
)

pytestmark = needs_helm


def shm_volume(deployment: dict[str, Any]) -> dict[str, Any] | None:
    pod = deployment["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in container(deployment)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    if "shm" not in volumes:
        assert "shm" not in mounts
        return None
    assert mounts["shm"] == "/dev/shm"
    return volumes["shm"]["emptyDir"]


@pytest.mark.parametrize(
    ("values", "gpus", "ranks"),
    [
        (None, "1", 1),
        (CHART / "ci" / "gpu-values.yaml", "8", 8),
        (CHART / "ci" / "cpu-values.yaml", None, 1),
    ],
    ids=["default", "gpu", "cpu"],
)
def test_the_learner_runs_a_rank_per_gpu(
    values: Path | None, gpus: str | None, ranks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(values)
    learner = deployments(docs)["learner"]
    assert container(learner)["resources"].get("limits", {}).get("nvidia.com/gpu") == gpus
    env = [e["name"] for e in container(learner)["env"]]
    assert env.count("TEMPERED_LEARNER__RANKS") == 1
    assert settings_from(worker_env(docs, "learner"), monkeypatch).learner.ranks == ranks
    assert shm_volume(learner) == {"medium": "Memory", "sizeLimit": "16Gi"}
    for queue, deployment in deployments(docs).items():
        if queue != "learner":
            assert shm_volume(deployment) is None
            assert "TEMPERED_LEARNER__RANKS" not in worker_env(docs, queue)


def test_the_learners_env_may_set_its_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(None, "workers.learner.env.TEMPERED_LEARNER__RANKS=2", "workers.learner.gpu=4")
    learner = deployments(docs)["learner"]
    env = [e["name"] for e in container(learner)["env"]]
    assert env.count("TEMPERED_LEARNER__RANKS") == 1
    assert settings_from(worker_env(docs, "learner"), monkeypatch).learner.ranks == 2


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        ("workers.learner.replicas=3", "replicas is 3"),
        ("defaults.replicas=2", "replicas is 2"),  # inherited
        ("workers.learner.autoscaling.enabled=true", "autoscaling.enabled is true"),
        ("workers.learner.keda.enabled=true", "keda.enabled is true"),
        ("workers.learner.strategy.type=RollingUpdate", "strategy.type is RollingUpdate"),
    ],
)
def test_never_more_than_one_learner(item: str, reason: str) -> None:
    """One DeepSpeed engine owns the learner's GPUs and the policy it publishes: a second
    replica, an autoscaler that adds one, or a rolling update's surge pod beside the old one
    once rendered as asked."""
    refusal = refused(item)
    assert "workers.learner runs one pod at most" in refusal, refusal
    assert reason in refusal, refusal


def test_the_learner_may_be_scaled_to_zero() -> None:
    learner = deployments(render(None, "workers.learner.replicas=0"))["learner"]
    assert learner["spec"]["replicas"] == 0
