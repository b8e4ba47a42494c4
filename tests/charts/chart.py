"""Rendering the Helm chart for the tests in tests/charts: helm, `render` and object lookups.

Needs the helm binary (`scripts/install-helm.sh` puts it in .tempered/bin; the Makefile's setup
runs it); test modules mark themselves `pytestmark = needs_helm`, which skips them with that
hint when it is missing. `render` caches each rendering, so the modules share them.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.settings import Settings
from tests.paths import REPO_ROOT

CHART = REPO_ROOT / "charts" / "tempered"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
VALUE_SETS = [None, *CI_VALUES]
RELEASE_NAMESPACE = "tempered"
WORKERS = ["agent-tasks", "inference", "sandbox", "rewards", "learner"]
CREDENTIAL_VALUES = {"s3": {"accessKey": "test-access-key", "secretKey": "test-secret-key"}}
"""The chart requires S3 credentials (or s3.existingSecret): a values file a test writes merges
these in; a helm run without a values file gets CREDENTIALS first (its own `--set`s come later
and win); the ci values files carry their own."""
CREDENTIALS = tuple(
    arg for key, value in CREDENTIAL_VALUES["s3"].items() for arg in ("--set", f"s3.{key}={value}")
)


def _helm() -> str | None:
    """The helm binary: on PATH, in $TEMPERED_HOME/bin or in the checkout's .tempered/bin."""
    for candidate in (
        shutil.which("helm"),
        os.environ.get("TEMPERED_HOME", "") + "/bin/helm",
        str(REPO_ROOT / ".tempered" / "bin" / "helm"),
    ):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


HELM = _helm()
needs_helm = pytest.mark.skipif(
    HELM is None, reason="helm not installed: run scripts/install-helm.sh"
)


def value_set_id(values: Path | None) -> str:
    """The test id of a value set: "default" or the file name."""
    return "default" if values is None else values.name


def with_credentials(args: tuple[str, ...]) -> list[str]:
    """`helm template` and `helm lint` without a values file, with CREDENTIALS."""
    if args[0] in ("template", "lint") and "-f" not in args:
        return [args[0], *CREDENTIALS, *args[1:]]
    return list(args)


def helm_run(*args: str) -> str:
    """helm's stdout; the test fails with helm's output when it exits non-zero."""
    assert HELM is not None
    done = subprocess.run(
        [HELM, *with_credentials(args)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def helm_refusal(*args: str) -> str:
    """helm's output when it exits non-zero; the test fails when it succeeds."""
    assert HELM is not None
    done = subprocess.run(
        [HELM, *with_credentials(args)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0, f"helm {' '.join(args)} succeeded"
    return done.stdout + done.stderr


def refused(*sets: str, namespace: str | None = None) -> str:
    """helm's output when `helm template` of the chart with these `--set` items fails (the
    test fails when it renders): the render-and-refuse shape of the tests, in one place."""
    args = ["template", "tempered", str(CHART)]
    args += ["--namespace", namespace] if namespace else []
    return helm_refusal(*args, *(arg for item in sets for arg in ("--set", item)))


def refused_values(directory: Path, values: dict[str, Any]) -> str:
    """helm's output when `helm template` of the chart with `values` (written as a values file
    in `directory`, pytest's tmp_path, with CREDENTIAL_VALUES under them) fails."""
    values_file = directory / "refused-values.yaml"
    values_file.write_text(yaml.safe_dump({**CREDENTIAL_VALUES, **values}))
    return helm_refusal("template", "tempered", str(CHART), "-f", str(values_file))


def lint_refused(*sets: str) -> str:
    """helm's output when `helm lint --strict` of the chart with these `--set` items fails (the
    schema's refusals)."""
    return helm_refusal("lint", "--strict", str(CHART), *(a for i in sets for a in ("--set", i)))


@functools.cache
def render(values: Path | None = None, *sets: str) -> list[dict[str, Any]]:
    """The chart's objects rendered with a values file and `--set` items (cached)."""
    args = ["template", "tempered", str(CHART), "--namespace", RELEASE_NAMESPACE]
    args += ["-f", str(values)] if values else []
    for item in sets:
        args += ["--set", item]
    return [doc for doc in yaml.safe_load_all(helm_run(*args)) if doc]


def objects(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    """The rendered objects of `kind`, by name."""
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def deployments(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Deployments by queue."""
    return {
        d["metadata"]["labels"]["tempered.dev/queue"]: d
        for d in objects(docs, "Deployment").values()
    }


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    """A deployment's one container."""
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
    return {name: value for name, value in env.items() if name.startswith("TEMPERED_")}


def settings_from(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The settings a process with exactly the TEMPERED_* variables `env` loads."""
    for name in [n for n in os.environ if n.startswith("TEMPERED_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(CHART)  # no tempered.toml here
    return Settings()
