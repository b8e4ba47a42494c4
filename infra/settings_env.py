"""What `infra.settings.load_settings` checks around the settings model: the TOML file it reads
and the `TEMPERED_*` environment, each refused in one line that names the file or variable.

    path, implicit = settings_file(None)          # --config, else $TEMPERED_CONFIG, else ./
    source = toml_source(Settings, path, implicit)
    check_environment(Settings, os.environ)       # ValueError naming every bad variable

pydantic-settings ignores a `TEMPERED_` variable whose first part names no field (one `_` where
the nesting takes `__`, as in a misspelt `TEMPERED_<SECTION>_<FIELD>`); `check_environment`
refuses it, suggesting the spelling of a field it resembles. A wrong name after a section's
`__` is not checked here: the sections' `extra="forbid"` already names it. Nor are values,
but for the few the model cannot report clearly: an empty path (the working directory), and a
section set whole that is not a JSON object. It takes the model as an argument: this module
imports nothing of infra.settings, which imports it.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, TomlConfigSettingsSource

LOCAL_CONFIG = "tempered.toml"
"""Read from the working directory when no config file is named."""
IMPLICITLY = f"read implicitly, as the working directory's {LOCAL_CONFIG}"
"""Said of a settings file nobody named, in its errors (whoever ran the command may not know
one was there)."""
PREFIX = "TEMPERED_"
NOT_SETTINGS = frozenset(
    {
        "TEMPERED_WORKER_ID",  # the chart's pod name, labels sandbox Jobs (infra/sandbox)
        "TEMPERED_RUN",  # a sandbox Job's own (infra/sandbox/kubernetes_job.py) …
        "TEMPERED_RESULT_NONCE",
        "TEMPERED_RECORD_HISTORIES",  # switches of tests whose workers inherit them
        "TEMPERED_LOAD_TASKS",
    }
)
"""`TEMPERED_` variables the code reads that are no settings (exact names: the code reads them
so)."""
NOT_SETTINGS_CHUNKED = re.compile(r"TEMPERED_(SOURCES|JOB)_\d+")
"""… and a sandbox Job's payloads, split into numbered chunks (infra/sandbox/kubernetes_job.py)."""


def local_config() -> Path | None:
    """./tempered.toml when there is one (anything by that name: a directory is an error)."""
    local = Path(LOCAL_CONFIG)
    return local.resolve() if local.exists() else None


def settings_file(named: object) -> tuple[Path | None, bool]:
    """The TOML file settings are read from, and whether it was found rather than named: the
    `config` argument, else $TEMPERED_CONFIG, else ./tempered.toml when there is one."""
    path = named or os.environ.get("TEMPERED_CONFIG")
    if path:
        return Path(str(path)), False
    local = local_config()
    return local, local is not None


def noted(message: str, named: object) -> str:
    """`message` naming the settings file, where one was read that `named` did not name."""
    path, implicit = settings_file(named)
    return f"{message} (settings file {path}, {IMPLICITLY})" if implicit else message


def toml_source(
    settings_cls: type[BaseSettings], path: Path, implicit: bool
) -> TomlConfigSettingsSource:
    """The source of the settings file `path`; ValueError naming it if it cannot be read."""
    note = f"; it was {IMPLICITLY}" if implicit else ""
    try:
        if not path.exists():
            raise ValueError(f"settings file {path} does not exist{note}")
        if path.is_file():
            return TomlConfigSettingsSource(settings_cls, path)
        reason = "a directory" if path.is_dir() else "not a regular file"  # the source skips it
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML ({exc}){note}") from None
    except UnicodeDecodeError as exc:
        reason = f"not UTF-8: {exc.reason} at byte {exc.start}"
    except OSError as exc:  # unreadable, …
        reason = exc.strerror or str(exc)
    raise ValueError(f"{path}: cannot read settings file ({reason}){note}")


def check_environment(model: type[BaseModel], environ: Mapping[str, str]) -> None:
    """Raise ValueError naming every `TEMPERED_` variable of `environ` that names no field of
    `model` (nor is one the code reads), is an empty path, or sets a section to no JSON object.
    Names are matched in any case, as pydantic-settings matches them."""
    problems = [
        problem
        for name, value in sorted(environ.items())
        if name.upper().startswith(PREFIX) and (problem := _problem(model, name, value))
    ]
    if problems:
        raise ValueError("; ".join(problems))


def _problem(model: type[BaseModel], name: str, value: str) -> str | None:
    if name in NOT_SETTINGS or NOT_SETTINGS_CHUNKED.fullmatch(name):
        return None
    parts = name[len(PREFIX) :].lower().split("__")
    field: FieldInfo | None = None
    for depth, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None or (_section(field) is None and depth < len(parts) - 1):
            # pydantic-settings drops a name whose first part is no field, or a scalar one
            # nested further; past a section, its extra="forbid" (or validation) names the fault
            return _unknown(model, name) if depth == 0 else None
        model = _section(field) or model
    assert field is not None  # a split gives a part
    if _section(field) is not None:
        try:
            whole = isinstance(json.loads(value), dict)
        except ValueError:
            whole = False
        if not whole:
            return (
                f"environment variable {name} is not a JSON object (set a section whole as "
                f"one, or each field as {name.upper()}__<FIELD>)"
            )
    elif value == "" and _takes_path(field.annotation):
        return f"environment variable {name} is empty: unset it or give a path"
    return None


def _unknown(model: type[BaseModel], name: str) -> str:
    spellings = {"_".join(path).upper(): "__".join(path).upper() for path in _field_paths(model)}
    given = name[len(PREFIX) :].upper()
    like = spellings.get(re.sub("_+", "_", given).strip("_"))
    if like is None:
        close = difflib.get_close_matches(given, spellings.values(), n=1, cutoff=0.8)
        like = close[0] if close else None
    if like is not None:
        return f"environment variable {name} names no setting (did you mean {PREFIX}{like}?)"
    return (
        f"environment variable {name} names no setting (settings variables are "
        f"{PREFIX}<FIELD> or {PREFIX}<SECTION>__<FIELD>, e.g. {PREFIX}S3__BUCKET)"
    )


def _field_paths(model: type[BaseModel], above: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, field in model.model_fields.items():
        yield (*above, name)
        if section := _section(field):
            yield from _field_paths(section, (*above, name))


def _section(field: FieldInfo) -> type[BaseModel] | None:
    annotation = field.annotation
    return (
        annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
    )


def _takes_path(annotation: Any) -> bool:
    """Whether a field's type is a Path, or a union or Annotated of one."""
    if isinstance(annotation, type):
        return issubclass(annotation, Path)
    return any(_takes_path(arg) for arg in get_args(annotation))
