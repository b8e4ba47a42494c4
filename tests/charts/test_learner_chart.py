"""The chart's learner: one DeepSpeed rank per GPU it requests, and a /dev/shm for NCCL.

Rendering, strict 1.33 validation and lint of every value set are tests/charts/test_chart.py's;
this checks what the learner's pod tells the worker (settings.learner.ranks) and mounts.
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
