"""stateDir: where every worker's state emptyDir is mounted (TEMPERED_HOME), and the caches that
live there (HOME, HF_HOME: the image points them at /var/lib/tempered, the default stateDir,
and the root file system is read-only).

A stateDir of /tmp, /dev/shm or / rendered two mounts at one path, or one at the root: the
schema admitted them and kubernetes-validate passes them, the API server refuses them (a
container's mountPaths must be unique). Skipped without helm.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.charts.chart import (
    CHART,
    VALUE_SETS,
    container,
    deployments,
    lint_refused,
    needs_helm,
    render,
    value_set_id,
)

pytestmark = needs_helm

DOCKERFILE = CHART.parent.parent / "Dockerfile"


@pytest.mark.parametrize(
    "state_dir",
    [
        "/tmp",
        "/dev/shm",
        "/",
        "/tmp/",
        "/var/lib/tempered/",
        "/var/lib//tempered",
        "/var/lib/tempered/../x",
        "/var/lib/tempered-workspaces",
        "/run/tempered/proc",
        "/proc/x",
        "/dev",
        "var/lib/tempered",
    ],
)
def test_the_schema_refuses_a_state_dir_that_collides(state_dir: str) -> None:
    refusal = lint_refused(f"stateDir={state_dir}")
    assert "stateDir" in refusal, refusal


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_set_id)
@pytest.mark.parametrize("state_dir", [None, "/data/tempered", "/tmp/tempered"])
def test_every_mount_path_is_its_own(values: Path | None, state_dir: str | None) -> None:
    sets = () if state_dir is None else (f"stateDir={state_dir}",)
    for queue, deployment in deployments(render(values, *sets)).items():
        paths = [m["mountPath"] for m in container(deployment)["volumeMounts"]]
        assert len(paths) == len(set(paths)), (queue, paths)


def test_the_image_points_home_and_hf_home_at_the_default_state_dir() -> None:
    """Why the chart sets them: the image's HOME (the tempered user's) and HF_HOME are in the
    default stateDir; another stateDir leaves them on the read-only root file system."""
    text = DOCKERFILE.read_text()
    assert "--home-dir /var/lib/tempered " in text
    assert "HF_HOME=/var/lib/tempered/hf" in text
    assert "TEMPERED_HOME=/var/lib/tempered " in text


@pytest.mark.parametrize("state_dir", [None, "/data/tempered"])
def test_home_and_hf_home_are_in_the_state_dir(state_dir: str | None) -> None:
    sets = () if state_dir is None else (f"stateDir={state_dir}",)
    expected = state_dir or "/var/lib/tempered"
    for queue, deployment in deployments(render(None, *sets)).items():
        env = {e["name"]: e.get("value") for e in container(deployment)["env"]}
        assert env["HOME"] == expected, queue
        assert env["HF_HOME"] == f"{expected}/hf", queue
        mounts = [m["mountPath"] for m in container(deployment)["volumeMounts"]]
        assert expected in mounts


def test_a_worker_env_may_set_its_own_home() -> None:
    docs = render(None, "workers.inference.env.HF_HOME=/tmp/hf")
    names = [e["name"] for e in container(deployments(docs)["inference"])["env"]]
    assert names.count("HF_HOME") == 1 and names.count("HOME") == 1
    env = {e["name"]: e.get("value") for e in container(deployments(docs)["inference"])["env"]}
    assert env["HF_HOME"] == "/tmp/hf"
