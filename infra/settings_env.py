"""What `infra.settings.load_settings` checks around the settings model: the TOML file it reads
and the `TEMPERED_*` environment, each refused in one line that names the file or variable;
where its paths are relative to; and how its errors are told.

    path, implicit = settings_file(None)          # --config, else $TEMPERED_CONFIG, else ./
    sources = toml_sources(Settings, None)        # its source, or () where there is no file
    check_environment(Settings, os.environ)       # ValueError naming every bad variable
    describe_invalid(exc, Settings, origins(overrides, os.environ))  # a ValidationError, told

pydantic-settings ignores a `TEMPERED_` variable whose first part names no field (one `_` where
the nesting takes `__`, as in a misspelt `TEMPERED_<SECTION>_<FIELD>`); `check_environment`
refuses it, and one that names no field further down, suggesting the spelling of a field it
resembles (`closest_field`, which also serves a misspelt key of a TOML file, a section set
whole as JSON, or any model's input: `describe_invalid`). Values are not checked here, but for
the few the model cannot report clearly: an empty path (the working directory; in a settings
file too), a section set whole that is not a JSON object, and a `config` key in a settings file
(the file that holds it was read, but workers would get the one it names as TEMPERED_CONFIG). A value the model refuses is told with its source: the
variable, or the settings file (`origins`); an argument's caller knows it gave it.

A path is absolute once loaded, by one rule (`absolute`): `~` expanded, a relative one joined
to the settings file's directory where the file gave it (`toml_sources`), else to the working
directory. A file's relative `home` that this rule moved away from its runs is refused
(infra/settings_home.py). This module takes the model as an argument: it imports nothing of
infra.settings, which imports it.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import tomllib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Annotated, Any, get_args

from pydantic import AfterValidator, BaseModel, BeforeValidator, FilePath, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, TomlConfigSettingsSource

from contracts.common import describe_validation_error
from infra.settings_home import warn_moved_home

LOCAL_CONFIG = "tempered.toml"
"""Read from the working directory when no config file is named."""
IMPLICITLY = f"read implicitly, as the working directory's {LOCAL_CONFIG}"
"""Said of a settings file nobody named, in its errors (whoever ran the command may not know
one was there)."""
CONFIG = "config"
"""The settings file's own field: given by an argument or the environment, never by a file."""
HOME = "home"
"""The state directory's field, whose relative value in a file moved (infra/settings_home.py)."""
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
NOT_SETTINGS_CHUNKED = re.compile(r"TEMPERED_JOB_\d+")
"""… and a sandbox Job's payloads, split into numbered chunks (infra/sandbox/kubernetes_job.py)."""


def local_config() -> Path | None:
    """./tempered.toml when there is one (anything by that name: a directory is an error)."""
    local = Path(LOCAL_CONFIG)
    return local.resolve() if local.exists() else None


def settings_file(named: object) -> tuple[Path | None, bool]:
    """The TOML file settings are read from, and whether it was found rather than named: the
    `config` argument, else $TEMPERED_CONFIG, else ./tempered.toml when there is one."""
    path = named or os.environ.get("TEMPERED_CONFIG")
    if path:  # `~` expanded, as in TEMPERED_HOME (`absolute`)
        return Path(str(path)).expanduser(), False
    local = local_config()
    return local, local is not None


def absolute(path: Path, base: Path | None = None) -> Path:
    """`path` with `~` expanded; a relative one joined to `base`, else the working directory."""
    path = path.expanduser()
    return path if path.is_absolute() else (base or Path.cwd()) / path


def _expanded(value: object) -> object:
    """A str or Path with `~` expanded; anything else as it is (the model refuses it)."""
    return Path(value).expanduser() if isinstance(value, (str, Path)) and value else value


AbsolutePath = Annotated[Path, AfterValidator(absolute)]
"""A path field's type: absolute, so worker processes started elsewhere see the same files."""
AbsoluteFile = Annotated[FilePath, BeforeValidator(_expanded), AfterValidator(absolute)]
"""… of a file that exists (`~` expanded before it is looked for)."""


class _TomlFile(TomlConfigSettingsSource):
    """A settings file whose relative paths are relative to its own directory; its `home`, when
    no higher source gives one, is checked against the working directory's reading of it, the
    one of the release before (`warn_moved_home`)."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path, check_home: bool) -> None:
        self.model, self.check_home = settings_cls, check_home  # before super() reads the file
        super().__init__(settings_cls, path)

    def _read_file(self, file_path: Path | Traversable) -> dict[str, Any]:
        data = super()._read_file(file_path)
        path = Path(str(file_path))
        if CONFIG in data:  # the CLI read this file, its workers (TEMPERED_CONFIG) the one named
            raise ValueError(
                f"settings file {path}: a `{CONFIG}` key is not followed in a settings file; name "
                "the file with --config or TEMPERED_CONFIG"
            )
        if self.check_home and isinstance(home := data.get(HOME), str):
            warn_moved_home(home, path)
        _anchor(self.model, data, path.absolute().parent, path)
        return data


def _anchor(
    model: type[BaseModel], data: dict[str, Any], base: Path, file: Path, above: str = ""
) -> None:
    """Make the relative paths that `data` gives `model`'s path fields relative to `base`;
    ValueError naming `file` for an empty one (it read as the working directory, where the
    environment's empty path is refused: `check_environment`)."""
    for key, value in data.items():
        field = model.model_fields.get(key)
        if field is None:
            continue  # refused by the model
        if (section := _section(field)) and isinstance(value, dict):
            _anchor(section, value, base, file, f"{above}{key}.")
        elif _takes_path(field.annotation) and value == "":
            raise ValueError(
                f"settings file {file}: {above}{key} is empty: remove it or give a path"
            )
        elif _takes_path(field.annotation) and isinstance(value, str):
            data[key] = str(absolute(Path(value), base))


def toml_sources(
    settings_cls: type[BaseSettings], named: object, given: Collection[str] = ()
) -> tuple[TomlConfigSettingsSource, ...]:
    """The source of the settings file (`settings_file`), if there is one; ValueError naming it
    if it cannot be read, or if its relative `home` moved from where its runs are (unless
    `given`, the fields a higher source gives, holds `home`: the file's is not used then)."""
    path, implicit = settings_file(named)
    if path is None:
        return ()
    note = f"; it was {IMPLICITLY}" if implicit else ""
    try:
        if not path.exists():
            raise ValueError(f"settings file {path} does not exist{note}")
        if path.is_file():
            return (_TomlFile(settings_cls, path, check_home=HOME not in given),)
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


def _problem(root: type[BaseModel], name: str, value: str) -> str | None:
    if name in NOT_SETTINGS or NOT_SETTINGS_CHUNKED.fullmatch(name):
        return None
    parts = name[len(PREFIX) :].lower().split("__")
    field: FieldInfo | None = None
    model = root
    for depth, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None or (_section(field) is None and depth < len(parts) - 1):
            # pydantic-settings drops a name whose first part is no field, or a scalar one
            # nested further; past a section, extra="forbid" named it, but without the name meant
            return _unknown(root, name)
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
    like = closest_field(model, name[len(PREFIX) :].split("__"))
    if like is not None:
        spelt = "__".join(like).upper()
        return f"environment variable {name} names no setting (did you mean {PREFIX}{spelt}?)"
    return (
        f"environment variable {name} names no setting (settings variables are "
        f"{PREFIX}<FIELD> or {PREFIX}<SECTION>__<FIELD>, e.g. {PREFIX}S3__BUCKET)"
    )


def closest_field(model: type[BaseModel], given: Sequence[str]) -> tuple[str, ...] | None:
    """The field of `model` (a path into its sections) that the path `given`, which names none,
    most likely means: the same words joined otherwise (`temporal_address` for `temporal`,
    `address`), the one field of that name in any section, or a close spelling."""
    paths = list(_field_paths(model))
    parts = [part.lower() for part in given]
    flat = re.sub("_+", "_", "_".join(parts)).strip("_")
    if joined := [path for path in paths if "_".join(path) == flat]:
        return joined[0]
    if len(named := [path for path in paths if parts and path[-1] == parts[-1]]) == 1:
        return named[0]
    spelt = {".".join(path): path for path in paths}
    close = difflib.get_close_matches(".".join(parts), spelt, n=1, cutoff=0.8)
    return spelt[close[0]] if close else None


def describe_invalid(
    error: ValidationError,
    model: type[BaseModel],
    origin: Callable[[tuple[str, ...]], str | None] | None = None,
) -> str:
    """`contracts.common.describe_validation_error`'s line, each field followed by the field a
    key that names none most likely means (`closest_field`) and, given `origin`, where its
    value came from."""

    def note(fault: ErrorDetails) -> str:
        loc = tuple(str(part) for part in fault["loc"])
        text = ""
        if fault["type"] == "extra_forbidden" and (like := closest_field(model, loc)):
            text += f" (did you mean {'.'.join(like)}?)"
        if origin is not None and (where := origin(loc)):
            text += f" ({where})"
        return text

    return describe_validation_error(error, note)


_ABSENT = object()


def origins(
    overrides: Mapping[str, Any], environ: Mapping[str, str]
) -> Callable[[tuple[str, ...]], str | None]:
    """Where the settings' value at a path came from, for `describe_invalid`: the `TEMPERED_`
    variables and the settings file that give it, highest priority first, stopping at one that
    gives it whole (the arguments, `overrides`, are not named: their caller knows them)."""
    layers: list[tuple[str | None, Any]] = [(None, overrides)]
    for name, value in sorted(environ.items()):
        if name.upper().startswith(PREFIX) and name not in NOT_SETTINGS:
            try:
                given = json.loads(value)  # a section set whole
            except ValueError:
                given = value
            for part in reversed(name[len(PREFIX) :].lower().split("__")):
                given = {part: given}
            layers.append((f"environment variable {name}", given))
    path, implicit = settings_file(overrides.get("config"))
    if path is not None:
        with contextlib.suppress(OSError, ValueError):  # read before: it was fine
            label = f"settings file {path}" + (f", {IMPLICITLY}" if implicit else "")
            layers.append((label, tomllib.loads(path.read_text(encoding="utf-8"))))

    def origin(loc: tuple[str, ...]) -> str | None:
        named = []
        for name, data in layers:
            for part in loc:
                data = data.get(part, _ABSENT) if isinstance(data, dict) else _ABSENT
            if data is _ABSENT:
                continue
            named += [name] if name else []
            if not isinstance(data, dict):
                break  # given whole: what lower layers give is not used
        return " and ".join(named) or None

    return origin


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
