"""The names the chart's `settings:` takes (values.schema.json's `settings.propertyNames.enum`),
generated from the settings model: every field that is no section, as its TEMPERED_ variable.

    .venv/bin/python -m tests.charts.settings_schema    # rewrites the enum in the schema

after a field of infra/settings.py is added, renamed or removed (tests/charts/
test_chart_fix60_settings_names.py fails until then). A pattern once let through a misspelt
name inside a section (TEMPERED_SANDBOX__WORKSPACES__MAX_TASK_MEM_MB), which the model refuses
(extra="forbid"): every worker exited at start. A section set whole (a JSON object) is not
offered: it would pass round the chart's refusal of the names it writes itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from infra.settings import Settings
from infra.settings_env import PREFIX, _field_paths
from tests.paths import REPO_ROOT

SCHEMA = REPO_ROOT / "charts" / "tempered" / "values.schema.json"


def settings_names() -> list[str]:
    """TEMPERED_<FIELD> and TEMPERED_<SECTION>__…__<FIELD> of every field that is no section."""
    paths = list(_field_paths(Settings))
    sections = {path[:-1] for path in paths}
    return sorted(PREFIX + "__".join(path).upper() for path in paths if path not in sections)


def with_settings_names(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` whose `settings:` takes exactly `settings_names()`."""
    updated: dict[str, Any] = json.loads(json.dumps(schema))
    updated["properties"]["settings"]["propertyNames"] = {"enum": settings_names()}
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
