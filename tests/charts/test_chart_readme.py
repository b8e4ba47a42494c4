"""The chart's README: the commands an operator copies from it match the code.

Plain text checks, no helm needed.
"""

from __future__ import annotations

import re

from contracts.names import SEARCH_ATTRIBUTE_TYPES
from tests.charts.chart import CHART


def _registration_command(readme: str) -> str:
    """The README's `temporal operator search-attribute create` command, continuation lines
    joined."""
    (command,) = re.findall(
        r"^[^\n]*temporal operator search-attribute create(?:[^\n]*\\\n)*[^\n]*$",
        readme,
        flags=re.MULTILINE,
    )
    return command.replace("\\\n", " ")


def test_readme_registers_every_search_attribute_with_its_type() -> None:
    """An attribute left out of the README's command is never registered, and every agent
    task's upsert of it then fails (TemperedToolCalls once was)."""
    command = _registration_command((CHART / "README.md").read_text())
    pairs = re.findall(r"--name\s+(\S+)\s+--type\s+(\S+)", command)
    assert len(pairs) == command.count("--name") == command.count("--type")
    registered = dict(pairs)
    assert len(registered) == len(pairs)  # no name twice
    assert registered == {str(name): kind for name, kind in SEARCH_ATTRIBUTE_TYPES.items()}
