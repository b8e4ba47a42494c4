"""Training presets: `TrainingRunInput`s as TOML files shipped inside the package.

    from infra.presets import load_preset, preset_names
    run_input = load_preset("tiny", steps=5)        # or a path to your own .toml
    preset_names()                                  # ['agent', 'smollm2', 'tiny']

The files are package data (`infra/presets/*.toml`, read with `importlib.resources`), so an
installed wheel or the container image finds them without a source checkout. Keys are fields
of `contracts.run.TrainingRunInput`; `run_id` defaults to `run-<timestamp>`.

A file of your own starts from `TrainingRunInput`'s defaults (the `tiny` model, 3 steps), not
from the default preset, unless it names the preset it changes: with `extends = "smollm2"` (a
shipped preset, or a `.toml` path, read beside the file that names it) it holds only what
differs, its tables merged into the preset's key by key:

    extends = "smollm2"
    [sampling]
    top_p = 1.0

An override (`tempered train --steps 0`) that no run could take is blamed on itself, not on the
preset; one that the preset's other values make wrong, on the preset.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
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


def load_preset(
    name: str, given_as: Mapping[str, str] | None = None, **overrides: Any
) -> TrainingRunInput:
    """The preset (by name or path) as a TrainingRunInput, with non-None overrides applied.
    `given_as` names an override for the error it alone makes (`tempered train`: its flag;
    else `override <field>`)."""
    where, values = _preset_values(name)
    given = {k: v for k, v in overrides.items() if v is not None}
    for field, value in given.items():
        _check_override(field, value, (given_as or {}).get(field, f"override {field}"))
    values.update(given)
    values.setdefault("run_id", datetime.now().strftime("run-%Y%m%d-%H%M%S"))
    try:
        run = TrainingRunInput.model_validate(values)
    except ValidationError as exc:
        raise ValueError(f"{where}: {describe_invalid(exc, TrainingRunInput)}") from None
    if problem := run.new_run_problem():
        raise ValueError(f"{where}: {problem}")
    return run


def _preset_values(name: str, chain: tuple[str, ...] = ()) -> tuple[str, dict[str, Any]]:
    """(where, values) of a preset by name or path, what it `extends` merged under its own;
    `chain`: the presets that extend it, to refuse a cycle."""
    where, text = preset_text(name)
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{where}: not valid TOML ({exc})") from None
    if "extends" not in values:
        return where, values
    base = values.pop("extends")
    if not isinstance(base, str):
        raise ValueError(f"{where}: extends: {base!r} is not a preset name or a .toml path")
    if base.endswith(".toml") and name.endswith(".toml"):  # beside the file, wherever run from
        base = os.path.normpath(Path(name).parent / base)
    if base in (*chain, name):
        raise ValueError(f"{where}: extends: {base} again (a cycle)")
    try:
        _, inherited = _preset_values(base, (*chain, name))
    except ValueError as exc:
        raise ValueError(f"{where}: extends: {exc}") from None
    return where, _merged(inherited, values)


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over`'s values, tables merged key by key (a list is replaced whole)."""
    merged = dict(base)
    for key, value in over.items():
        below = merged.get(key)
        if isinstance(value, dict) and isinstance(below, dict):
            merged[key] = _merged(below, value)
        else:
            merged[key] = value
    return merged


def _check_override(field: str, value: Any, named: str) -> None:
    """ValueError, blamed on `named`, when `value` of `field` fails on the contract's defaults:
    no preset could make it right."""
    alone = {"run_id": "override", field: value}
    try:
        problem = TrainingRunInput.model_validate(alone).new_run_problem()
    except ValidationError as exc:
        problem = describe_invalid(exc, TrainingRunInput)
    if problem:
        raise ValueError(f"{named} {value}: {problem}")
