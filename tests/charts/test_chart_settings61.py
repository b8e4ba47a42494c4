"""Values `helm lint --strict` passed and every worker then refused at start: a misspelt
TEMPERED_* name in a worker's env (`defaults.env`, `workers.<queue>.env`; under `settings:` the
same name was refused), `settings.TEMPERED_CONFIG` (a file the chart cannot mount: "Path does
not point to a file") and a `telemetry.prometheus.host` that is no IP address (`localhost`,
`[::]`: the SDK's runtime refused it). And `omp_spin_count`'s None (libgomp's default) can be
given through the chart. Skipped without helm.
"""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from infra.settings import TelemetrySettings
from tests.charts.chart import (
    CHART,
    helm_run,
    lint_refused,
    needs_helm,
    refused,
    render,
    settings_from,
    worker_env,
)
from tests.charts.settings_schema import env_names, settings_names

pytestmark = needs_helm


def lint(*sets: str) -> None:
    helm_run("lint", "--strict", str(CHART), *(a for i in sets for a in ("--set-string", i)))


# -- a worker's env ----------------------------------------------------------------------------

MISSPELT = "TEMPERED_INFERENCE__VLLM__MAX_SEQS"  # TEMPERED_INFERENCE__VLLM__MAX_NUM_SEQS


@pytest.mark.parametrize(
    "item",
    [
        f"workers.inference.env.{MISSPELT}=128",
        f"defaults.env.{MISSPELT}=128",
        "defaults.env.TEMPERED_SANDBOX_CONCURRENCY=4",  # no field: pydantic-settings ignored it
        "workers.sandbox.env.TEMPERED_SANDBOX__WORKSPACES=1",  # a section whole
        "workers.learner.env.tempered_learner__threads=2",  # read in any case; the chart's checks not
        "workers.learner.env.TEMPERED_CONFIG=/etc/tempered.toml",  # no file there
    ],
)
def test_helm_lint_refuses_a_tempered_name_of_no_setting_in_a_workers_env(item: str) -> None:
    name = item.split("=")[0].rsplit(".", 1)[1]
    assert name in lint_refused(item)


def test_other_names_and_the_settings_pass_in_a_workers_env() -> None:
    lint(
        "workers.inference.env.TEMPERED_INFERENCE__VLLM__MAX_NUM_SEQS=128",
        "defaults.env.TEMPERED_OMP_SPIN_COUNT=default",
        "defaults.env.HF_TOKEN=x",
        "workers.learner.env.TEMPERED_LEARNER__RANKS=2",  # the learner's own, the chart leaves it
        "workers.learner.env.NCCL_DEBUG=INFO",
    )


def test_the_pods_own_worker_id_still_gets_the_charts_refusal() -> None:
    """TEMPERED_WORKER_ID passes the schema (a name the code reads) to meet the template's
    refusal, which says what it is (as settings: does with the names the chart writes; helm
    lint only logs a template's `fail`: `helm template` and `install` refuse)."""
    message = refused("workers.sandbox.env.TEMPERED_WORKER_ID=w")
    assert "each pod's own name" in message, message


def test_the_env_names_are_generated_from_the_settings() -> None:
    """Regenerate with `.venv/bin/python -m tests.charts.settings_schema`."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(env_names()) == set(settings_names()) | {"TEMPERED_WORKER_ID"}
    rule = schema["definitions"]["workerEnvName"]
    assert rule["then"]["enum"] == env_names()
    reference = {"$ref": "#/definitions/workerEnvName"}
    assert schema["properties"]["defaults"]["properties"]["env"]["propertyNames"] == reference
    worker = schema["properties"]["workers"]["additionalProperties"]["anyOf"][0]
    assert worker["properties"]["env"]["propertyNames"] == reference


# -- settings.TEMPERED_CONFIG ------------------------------------------------------------------


def test_config_is_no_name_the_chart_takes() -> None:
    assert "TEMPERED_CONFIG" not in settings_names()
    assert "TEMPERED_CONFIG" in lint_refused("settings.TEMPERED_CONFIG=/etc/tempered.toml")


# -- telemetry.prometheus.host -----------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    [
        "0.0.0.0",
        "127.0.0.1",
        "::",
        "::1",
        "::ffff:10.0.0.1",
        "localhost",
        "[::]",
        "0.0.0.0:9460",
        "fe80::1%eth0",
        "01.2.3.4",
        "",
    ],
)
def test_the_schema_and_the_model_agree_on_the_prometheus_host(host: str) -> None:
    try:
        TelemetrySettings(prometheus_host=host)
        taken = True
    except ValidationError:
        taken = False
    if taken:
        lint(f"telemetry.prometheus.host={host}")
    else:
        assert "/telemetry/prometheus/host" in lint_refused(f"telemetry.prometheus.host={host}")


def test_an_ipv6_host_reaches_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(None, "telemetry.prometheus.host=::")
    assert settings_from(worker_env(docs, "sandbox"), monkeypatch).telemetry.prometheus_host == "::"


# -- omp_spin_count ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["default", ""])
def test_libgomps_default_spin_count_can_be_given(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(None, f"settings.TEMPERED_OMP_SPIN_COUNT={value}")
    env = worker_env(docs, "inference")
    assert env["TEMPERED_OMP_SPIN_COUNT"] == value
    assert settings_from(env, monkeypatch).omp_spin_count is None
