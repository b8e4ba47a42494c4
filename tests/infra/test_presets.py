"""Preset files (infra/presets): a file's mistake is told in one line that says how to fix it."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.presets import load_preset


def test_a_misspelt_key_in_a_preset_file_names_the_key_meant(tmp_path: Path) -> None:
    preset = tmp_path / "mine.toml"
    preset.write_text('suite = "starter"\nbase_model = "tiny"\n[sampling]\ntemprature = 0.7\n')
    with pytest.raises(
        ValueError, match=r"sampling\.temprature: .*did you mean sampling\.temperature"
    ):
        load_preset(str(preset))
