"""The examples the chart's values.yaml gives in comments are settings the workers accept: an
operator who uncomments one gets a worker that starts (no helm needed)."""

from __future__ import annotations

import re

import pytest

from tests.charts.chart import CHART, settings_from

EXAMPLE = re.compile(r'^#\s+(TEMPERED_[A-Z0-9_]+):\s+"([^"]*)"\s*$', re.MULTILINE)


def test_every_commented_settings_example_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    examples = dict(EXAMPLE.findall((CHART / "values.yaml").read_text()))
    assert examples  # the `settings:` example
    for name, value in examples.items():
        settings_from({name: value}, monkeypatch)  # raises naming a field the model lacks
