"""`settings:` takes exactly the settings model's names (tests/charts/settings_schema.py
generates them into values.schema.json): a misspelt name inside a section passed the schema's
pattern, and the model refused it at every worker's start. Skipped without helm.
"""

from __future__ import annotations

import json

import pytest

from infra.settings import Settings
from infra.settings_env import check_environment
from tests.charts.chart import CHART, helm_run, lint_refused, needs_helm
from tests.charts.settings_schema import schema_text, settings_names, with_settings_names

pytestmark = needs_helm


def schema_names() -> list[str]:
    schema = json.loads((CHART / "values.schema.json").read_text())
    names: list[str] = schema["properties"]["settings"]["propertyNames"]["enum"]
    return names


def test_the_schema_names_are_the_models_generated() -> None:
    """Regenerate with `.venv/bin/python -m tests.charts.settings_schema`."""
    text = (CHART / "values.schema.json").read_text()
    assert schema_names() == settings_names()
    assert schema_text(with_settings_names(json.loads(text))) == text


def test_every_name_is_a_setting_and_none_is_a_section() -> None:
    """The model takes each as a variable (check_environment refuses a name of no field, and a
    section's name whose value is no JSON object)."""
    names = schema_names()
    check_environment(Settings, dict.fromkeys(names, "1"))
    assert {"TEMPERED_OMP_SPIN_COUNT", "TEMPERED_S3__BUCKET"} <= set(names)
    assert "TEMPERED_CONFIG" not in names  # a file the chart mounts none of
    assert "TEMPERED_SANDBOX__WORKSPACES__MAX_TASK_MEMORY_MB" in names
    assert not {"TEMPERED_SANDBOX", "TEMPERED_SANDBOX__WORKSPACES"} & set(names)


@pytest.mark.parametrize(
    "name",
    [
        "TEMPERED_SANDBOX__WORKSPACES__MAX_TASK_MEM_MB",  # inside a section: the model's refusal
        "TEMPERED_INFERENCE__VLLM__MAX_SEQS",
        "TEMPERED_SANDBOX_CONCURRENCY",  # no top-level field: pydantic-settings ignores it
        "TEMPERED_SANDBOX__WORKSPACES",  # a section whole
        "TEMPERED_WORKER_ID",  # a pod's own, no setting
    ],
)
def test_helm_refuses_a_name_of_no_setting(name: str) -> None:
    assert name in lint_refused(f"settings.{name}=2048")


def test_a_nested_setting_is_taken() -> None:
    helm_run(
        "lint",
        "--strict",
        str(CHART),
        "--set",
        "settings.TEMPERED_SANDBOX__WORKSPACES__MAX_TASK_MEMORY_MB=2048",
    )
