"""Training presets: `TrainingRunInput`s as TOML files shipped inside the package.

    from infra.presets import load_preset, preset_names
    run_input = load_preset("tiny", steps=5)        # or a path to your own .toml
    preset_names()                                  # ['agent', 'smollm2', 'tiny']

The files are package data (`infra/presets/*.toml`, read with `importlib.resources`), so an
installed wheel or the container image finds them without a source checkout. Keys are fields
of `contracts.run.TrainingRunInput`; `run_id` defaults to `run-<timestamp>`.
"""

from __future__ import annotations

import tomllib
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from contracts.run import TrainingRunInput
from infra.settings_env import describe_invalid

DEFAULT = "smollm2"
"""What `tempered train` (and so `make train`) runs without `--preset`."""


def preset_names() -> list[str]:
    """The names of the shipped presets."""
    files = resources.files(__name__).iterdir()
    return sorted(f.name.removesuffix(".toml") for f in files if f.name.endswith(".toml"))


def preset_text(name: str) -> tuple[str, str]:
    """(where, TOML text) of a shipped preset by name, or of a `.toml` file by path."""
    if name.endswith(".toml"):
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"preset file {name} does not exist")
        return str(path), path.read_text(encoding="utf-8")
    if name not in preset_names():
        known = ", ".join(preset_names())
        raise ValueError(f"unknown preset {name!r} (known: {known}; or give a .toml path)")
    return f"preset {name}", resources.files(__name__).joinpath(f"{name}.toml").read_text("utf-8")


def load_preset(name: str, **overrides: Any) -> TrainingRunInput:
    """The preset (by name or path) as a TrainingRunInput, with non-None overrides applied."""
    where, text = preset_text(name)
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{where}: not valid TOML ({exc})") from None
    values.update({k: v for k, v in overrides.items() if v is not None})
    values.setdefault("run_id", datetime.now().strftime("run-%Y%m%d-%H%M%S"))
    try:
        run = TrainingRunInput.model_validate(values)
    except ValidationError as exc:
        raise ValueError(f"{where}: {describe_invalid(exc, TrainingRunInput)}") from None
    if problem := run.new_run_problem():
        raise ValueError(f"{where}: {problem}")
    return run
