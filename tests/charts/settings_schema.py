"""The names the chart's `settings:` takes (values.schema.json's `settings.propertyNames.enum`),
generated from the settings model: every field that is no section, as its TEMPERED_ variable,
but `config` (NOT_OFFERED); and the TEMPERED_ names a worker's env takes (`defaults.env`,
`workers.<queue>.env`: `definitions.workerEnvName`), those and TEMPERED_WORKER_ID, other names
free.

    .venv/bin/python -m tests.charts.settings_schema    # rewrites the enum in the schema

after a field of infra/settings.py is added, renamed or removed (tests/charts/
test_chart_fix60_settings_names.py fails until then). A pattern once let through a misspelt
name inside a section (TEMPERED_SANDBOX__WORKSPACES__MAX_TASK_MEM_MB), which the model refuses
(extra="forbid"): every worker exited at start. A section set whole (a JSON object) is not
offered: it would pass round the chart's refusal of the names it writes itself. A worker's env
took any name, so a misspelt TEMPERED_ one there passed `helm lint --strict` and the pod
crash-looped at start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra.settings import Settings
from infra.settings_env import PREFIX, _field_paths
from tests.paths import REPO_ROOT

SCHEMA = REPO_ROOT / "charts" / "tempered" / "values.schema.json"


NOT_OFFERED = {"TEMPERED_CONFIG"}
"""Fields the chart does not take: `config` must name a file (AbsoluteFile), and the chart
mounts none (its settings are the ConfigMap's variables): the name linted, and every worker
exited "Path does not point to a file"."""
POD_NAMES = {"TEMPERED_WORKER_ID"}
"""TEMPERED_ names the code reads that are no setting (infra/settings_env.NOT_SETTINGS) and the
chart writes in a worker's env: let through to the chart's own refusal, which says what they are
(tempered.chartSettings). The others there are a sandbox Job's or tests' own."""
ENV_PREFIX = "^[Tt][Ee][Mm][Pp][Ee][Rr][Ee][Dd]_"
"""TEMPERED_ in any case, as pydantic-settings matches names (ECMA 262 has no flag for it)."""


def settings_names() -> list[str]:
    """TEMPERED_<FIELD> and TEMPERED_<SECTION>__…__<FIELD> of every field that is no section,
    but NOT_OFFERED."""
    paths = list(_field_paths(Settings))
    sections = {path[:-1] for path in paths}
    names = {PREFIX + "__".join(path).upper() for path in paths if path not in sections}
    return sorted(names - NOT_OFFERED)


def env_names() -> list[str]:
    """The TEMPERED_ names a worker's env takes: `settings_names()` and POD_NAMES."""
    return sorted({*settings_names(), *POD_NAMES})


def with_settings_names(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` whose `settings:` takes exactly `settings_names()`, and whose worker env
    (`defaults.env`, `workers.<queue>.env`) takes of the TEMPERED_ names `env_names()`."""
    updated: dict[str, Any] = json.loads(json.dumps(schema))
    properties = updated["properties"]
    properties["settings"]["propertyNames"] = {"enum": settings_names()}
    updated.setdefault("definitions", {})["workerEnvName"] = {
        "description": "A name of a worker's env: one starting TEMPERED_ (in any case) must be a "
        "setting's, as under `settings:`, or TEMPERED_WORKER_ID (which the chart refuses, "
        "saying why); other names are free. Generated: tests/charts/settings_schema.py.",
        "if": {"pattern": ENV_PREFIX},
        "then": {"enum": env_names()},
    }
    reference = {"$ref": "#/definitions/workerEnvName"}
    properties["defaults"]["properties"]["env"]["propertyNames"] = reference
    worker = properties["workers"]["additionalProperties"]["anyOf"][0]
    worker["properties"]["env"]["propertyNames"] = dict(reference)
    return updated


def schema_text(schema: dict[str, Any]) -> str:
    """The schema file's text: two-space JSON, as written here."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def regenerate(path: Path = SCHEMA) -> bool:
    """Rewrite the enum in the schema at `path`; whether it changed."""
    text = path.read_text()
    updated = schema_text(with_settings_names(json.loads(text)))
    if updated != text:
        path.write_text(updated)
    return updated != text


if __name__ == "__main__":
    print(f"{SCHEMA}: {'rewritten' if regenerate() else 'up to date'}")
