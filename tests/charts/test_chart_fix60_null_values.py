"""`null` removes a key, as values.yaml's header says: in a worker's `env:`, `defaults.env` and
`settings:` (the README's step that removes the snapshot-format override of an upgrade is one).

The schema once took only strings, numbers and booleans there, so helm refused the README's
`--set workers.sandbox.env.TEMPERED_SANDBOX__WORKSPACES__SNAPSHOT_FORMAT=null`; and a null that
reached a template was written as the string "<nil>", which every worker's settings refuse.
Skipped without helm.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts.chart import (
    CHART,
    CREDENTIAL_VALUES,
    WORKERS,
    container,
    deployments,
    helm_run,
    needs_helm,
    objects,
    render,
    settings_from,
    worker_env,
)

pytestmark = needs_helm

SNAPSHOT_FORMAT = "TEMPERED_SANDBOX__WORKSPACES__SNAPSHOT_FORMAT"


def values_file(directory: Path, values: dict[str, Any]) -> Path:
    """`values` (with CREDENTIAL_VALUES) as a values file in `directory`, pytest's tmp_path: what
    an earlier `helm upgrade` left for `--reuse-values`."""
    path = directory / "earlier-values.yaml"
    path.write_text(yaml.safe_dump({**CREDENTIAL_VALUES, **values}))
    return path


def readme_sets(name: str) -> list[str]:
    """The `--set` items of the chart README that name `name`, in their order."""
    readme = (CHART / "README.md").read_text()
    return re.findall(rf"--set\s+([^\s`]*{re.escape(name)}=[^\s`]*)", readme)


def test_the_readmes_removal_of_the_snapshot_format_renders_without_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_it, remove_it = readme_sets(SNAPSHOT_FORMAT)
    assert set_it.endswith("=1") and remove_it.endswith("=null"), (set_it, remove_it)
    earlier = values_file(tmp_path, {"workers": {"sandbox": {"env": {SNAPSHOT_FORMAT: "1"}}}})
    assert worker_env(render(earlier), "sandbox")[SNAPSHOT_FORMAT] == "1"
    helm_run("lint", "--strict", str(CHART), "-f", str(earlier), "--set", remove_it)
    docs = render(earlier, remove_it)
    env = worker_env(docs, "sandbox")
    assert SNAPSHOT_FORMAT not in env
    assert settings_from(env, monkeypatch).sandbox.workspaces.snapshot_format == 2


def test_null_in_defaults_env_removes_the_variable_from_every_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    earlier = values_file(tmp_path, {"defaults": {"env": {"TEMPERED_OMP_SPIN_COUNT": "5"}}})
    docs = render(earlier, "defaults.env.TEMPERED_OMP_SPIN_COUNT=null")
    for queue in WORKERS:
        names = [e["name"] for e in container(deployments(docs)[queue])["env"]]
        assert "TEMPERED_OMP_SPIN_COUNT" not in names, queue
        settings_from(worker_env(docs, queue), monkeypatch)  # no "<nil>" anywhere


def test_null_in_settings_removes_the_key_and_the_chart_names_the_device_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device named in `settings:` stops the chart from writing the learner's; a null there
    removed nothing (the key stayed, as "<nil>") and the chart still wrote none."""
    earlier = values_file(tmp_path, {"settings": {"TEMPERED_LEARNER__DEVICE": "cpu"}})
    docs = render(earlier, "settings.TEMPERED_LEARNER__DEVICE=null")
    (configmap,) = objects(docs, "ConfigMap").values()
    assert "TEMPERED_LEARNER__DEVICE" not in configmap["data"]
    assert all("<nil>" not in str(value) for value in configmap["data"].values())
    assert settings_from(worker_env(docs, "learner"), monkeypatch).learner.device == "cuda"
