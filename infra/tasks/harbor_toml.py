"""A Harbor task's task.toml read (`infra/tasks/harbor.py`): the check, the split, the memory,
and what the loader warns of.

    read = read_config(tomllib.loads(text))   # ValueError (ValidationError too) naming the key
    read.check, read.split                    # Check(kind="script", ...), "train"|"heldout"
    read.memory_mb                            # [environment] memory_mb (or memory), else None
    read.unknown                              # keys Harbor does not have, dotted: one warning
    read.unapplied                            # one line per limit the task sets: one warning each

Tempered reads `[verifier] timeout_sec` (a number of seconds, or a string of one, as Harbor's
float field takes it, at least `MIN_CHECK_S` and at most `tree.MAX_CHECK_S`; a boolean is an
error; without it Harbor's default, `VERIFIER_TIMEOUT_S`, not the run's sandbox limit of 10 s),
`[verifier.env]` (variable names as a Dockerfile's ENV takes them; strings, numbers and
booleans, spelt as TOML spells them; no NUL), `[environment] memory_mb` (or the older `memory =
"4G"`: `memory_mb`)
and `[metadata] split`; a wrong type there is an error. The memory is the task's
(`WorkspaceSpec.memory_mb`): its agent's commands and its check run within it, more or less
than the run's `limits.memory_mb`, at most the sandbox worker's cap (a task asking more than
its default, `MAX_TASK_MEMORY_MB`, is warned of: it runs within the cap). The rest of Harbor's
limits (`LIMITS`: [environment] cpus, storage_mb, gpus, allow_internet = true, the older
storage; [agent] timeout_sec) are checked for their type (Harbor's) and each one a task sets
is a warning naming it and its value, since nothing applies it: a sandbox has no CPU share (`infra/sandbox/cgroups.py` bounds CPU time),
its workspace's quota is the worker's (`sandbox.workspaces.max_workspace_mb`), and an episode
ends at the run's `max_turns`, each command at the run's `limits.timeout_s`. The rest of
Harbor's format (`KEYS`, and the rest of [metadata], [environment] and [agent]) is accepted
and ignored. Other keys, at the top or in [verifier], are ignored as Harbor ignores them, with
one warning per task naming them, except a close misspelling of a key Tempered reads: an error
asking "did you mean" (a typo such as `timeout_secs` once gave the default silently), in
[metadata] too (`spilt` once loaded a held-out task as train).
"""

from __future__ import annotations

import datetime
import difflib
import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import StrictBool, StrictStr, TypeAdapter

from contracts.task import MAX_CHECK_S, MAX_MEMORY_MB, MIN_MEMORY_MB
from infra.environments.tree import Check
from infra.settings import WorkspaceSettings
from infra.tasks.harbor_words import ENV_KEY

KEYS = {
    "": (
        ("verifier", "metadata"),
        ("version", "schema_version", "source", "steps", "artifacts",
         "multi_step_reward_strategy", "task", "agent", "environment", "solution"),
    ),
    "verifier": (
        ("timeout_sec", "env"),
        ("user", "network_mode", "allowed_hosts", "environment_mode", "environment",
         "continuous", "collect"),
    ),
}  # fmt: skip
"""Harbor's task.toml keys, at the top and in [verifier]: (those Tempered reads, those it
ignores). Any other key there is ignored with a warning, or an error where it is a close
misspelling (`CLOSE`) of one Tempered reads."""
CLOSE = 0.8
"""difflib's ratio from which an unknown key is taken for a misspelling: `timeout_secs`,
`verifierr` and `envs` are; `restart_environment` and `ground_truth` are not."""
VERIFIER_TIMEOUT_S = 600.0
"""test.sh's wall time when task.toml names no `[verifier] timeout_sec`: Harbor's own default
(`VerifierConfig.timeout_sec` in Harbor's src/harbor/models/task/config.py). The run's sandbox
limit (`SandboxLimits.timeout_s`, 10 s) once stood in for it and scored a correct answer 0
whose test took 12 s."""
MIN_CHECK_S = 1.0
"""The shortest `[verifier] timeout_sec`: less leaves a test script no time to run (0.001 once
loaded: every verify timed out, and a correct answer scored 0, silently)."""
_STORAGE = "its workspace holds sandbox.workspaces.max_workspace_mb"
LIMITS: dict[tuple[str, str], tuple[type, str | None]] = {
    ("agent", "timeout_sec"): (float, "an episode ends at the run's max_turns and timeouts"),
    ("environment", "memory_mb"): (int, None),
    ("environment", "memory"): (str, None),
    ("environment", "cpus"): (int, "its commands and its check run within the run's limits.cpu_s"),
    ("environment", "storage_mb"): (int, _STORAGE),
    ("environment", "storage"): (str, _STORAGE),
    ("environment", "gpus"): (int, "a sandbox has no GPU"),
    ("environment", "allow_internet"): (bool, "a sandbox has no network: what needs one fails"),
}
"""Harbor's limits: (table, key) → (Harbor's type, what applies instead: None for the memory,
which applies: `_memory`). Each one a task sets that does not apply is warned of
(`allow_internet` only where true: no network is what runs anyway)."""
SIZE_UNITS = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}
"""MB in a unit of the older `memory` string ("4G", "512M": Harbor's `_parse_size_to_mb`, which
takes these alone, in either case, after a number)."""
MAX_TASK_MEMORY_MB: int = WorkspaceSettings.model_fields["max_task_memory_mb"].default
"""A sandbox worker's cap on a task's memory by default: a task asking more is warned of."""
_MEMORY_BOUND = (
    f"a sandbox's memory limit is at least {MIN_MEMORY_MB} MB and at most {MAX_MEMORY_MB} MB "
    "(SandboxLimits.memory_mb)"
)
_TYPES: dict[type, tuple[TypeAdapter[Any], str]] = {
    float: (TypeAdapter(float), "a number"),
    int: (TypeAdapter(int), "an integer"),
    str: (TypeAdapter(StrictStr), "a string"),
    bool: (TypeAdapter(StrictBool), "true or false"),
}
"""How Harbor's pydantic fields take each type (a numeric string for a number too), and its
name for an error; a boolean is no number here (Harbor's would take it for 0 or 1)."""


@dataclass(frozen=True)
class Config:
    """What task.toml asks for (`read_config`)."""

    check: Check
    split: Any
    """[metadata] split as it is: `TaskSpec` checks it (an error blamed on task.toml)."""
    unknown: list[str]
    """Keys Harbor does not have, dotted (`verifier.x`)."""
    unapplied: list[str]
    """One line per limit the task sets that no run applies (`LIMITS`): `[table] key = value:
    not applied: what applies instead`; and one for a memory past the default cap."""
    memory_mb: int | None = None
    """The memory the task states (`WorkspaceSpec.memory_mb`), in MB; None, the run's."""


def read_config(config: dict[str, Any]) -> Config:
    """The check, the split and the memory task.toml asks for, the keys it has that Harbor does
    not, and the limits it sets that are not applied; ValueError naming the key at fault."""
    unknown = _unknown(config, "")
    verifier, metadata = _table(config, "verifier"), _table(config, "metadata")
    unknown += _unknown(verifier, "verifier")
    _misspelt(metadata, "metadata", ("split",))  # the rest of [metadata] is free-form
    timeout = _timeout(verifier.get("timeout_sec", VERIFIER_TIMEOUT_S))
    env = {
        key: _env_value(key, value) for key, value in _table(verifier, "env", "verifier.").items()
    }
    check = Check(kind="script", tests="test.sh", timeout_s=timeout, env=env)
    unapplied = _unapplied(config)  # each limit's type first
    memory = _memory(_table(config, "environment"))
    if memory is not None and memory > MAX_TASK_MEMORY_MB:  # the worker's own cap is its own
        unapplied.append(
            f"[environment] memory {memory} MB: more than a sandbox worker gives by default "
            f"(sandbox.workspaces.max_task_memory_mb, {MAX_TASK_MEMORY_MB} MB): its steps and "
            "check run within the worker's cap"
        )
    return Config(check, metadata.get("split", "train"), unknown, unapplied, memory)


def _unapplied(config: dict[str, Any]) -> list[str]:
    """A line for each of `LIMITS` that task.toml sets, in its order; ValueError for one of a
    wrong type."""
    lines = []
    for within in dict.fromkeys(within for within, _ in LIMITS):
        for key, value in _table(config, within).items():
            if (within, key) not in LIMITS:
                continue
            kind, instead = LIMITS[within, key]
            adapter, wanted = _TYPES[kind]
            try:
                if isinstance(value, bool) and kind is not bool:
                    raise ValueError
                adapter.validate_python(value)
            except ValueError:  # ValidationError too
                shown = repr(value) if isinstance(value, str) else _kind(value)
                raise ValueError(f"[{within}] {key}: {wanted}, not {shown}") from None
            if instead is not None and (key != "allow_internet" or value):
                spelt = json.dumps(value)  # as TOML spells it: true, "4G", 4096
                lines.append(f"[{within}] {key} = {spelt}: not applied: {instead}")
    return lines


def _memory(environment: dict[str, Any]) -> int | None:
    """[environment] memory_mb, or the older memory ("4G") in MB (Harbor's int, its types
    checked: `_unapplied`); None where neither is set. ValueError for a size Harbor would not
    read, for both set to different sizes (which one was meant is not for the loader to guess),
    and for one outside a sandbox's bounds (`_MEMORY_BOUND`)."""
    stated: dict[str, int] = {}
    if "memory_mb" in environment:
        stated["memory_mb"] = _TYPES[int][0].validate_python(environment["memory_mb"])
    if "memory" in environment:
        stated["memory"] = _size_mb(environment["memory"])
    spelt = {key: f"{key} = {json.dumps(environment[key])}" for key in stated}
    if len(set(stated.values())) > 1:
        raise ValueError(
            f"[environment] {spelt['memory_mb']} and {spelt['memory']} ({stated['memory']} MB) "
            "differ: state one"
        )
    for key, mb in stated.items():
        if not MIN_MEMORY_MB <= mb <= MAX_MEMORY_MB:
            size = f" {mb} MB:" if key == "memory" else ""
            raise ValueError(f"[environment] {spelt[key]}:{size} {_MEMORY_BOUND}")
    return next(iter(stated.values()), None)


def _size_mb(value: str) -> int:
    """The older `memory` string in MB, as Harbor's `_parse_size_to_mb` reads it (a number and
    G, M or K; a fraction of a MB dropped); ValueError for what it would not read."""
    text = value.strip().upper()
    unit = SIZE_UNITS.get(text[-1:])
    try:
        number = float(text[:-1]) if unit is not None else math.nan
    except ValueError:
        number = math.nan
    if unit is None or not math.isfinite(number):
        raise ValueError(
            f'[environment] memory: {value!r} is not a size (a number and G, M or K: "4G", '
            '"512M"; or memory_mb = 4096)'
        )
    return int(number * unit)


def _timeout(value: Any) -> float:
    """`[verifier] timeout_sec` in seconds; ValueError naming the key and its range (the cap
    is `Check.timeout_s`'s: once its own field name and bound were all the error said)."""
    key = "[verifier] timeout_sec"
    wanted = f"at least {MIN_CHECK_S:g} s, at most {MAX_CHECK_S:g} s"
    try:
        if isinstance(value, bool):  # Harbor's float would take it for 0 or 1 s
            raise ValueError
        seconds = _TYPES[float][0].validate_python(value)
    except ValueError:  # ValidationError too
        shown = repr(value) if isinstance(value, str) else _kind(value)
        raise ValueError(f"{key}: a number of seconds, not {shown} ({wanted})") from None
    if not MIN_CHECK_S <= seconds <= MAX_CHECK_S:  # NaN too
        raise ValueError(f"{key}: {value!r} seconds: a check takes {wanted}") from None
    return seconds


def _unknown(table: dict[str, Any], within: str) -> list[str]:
    """The keys of `table` (task.toml's top, or [`within`]) Harbor does not have, dotted;
    ValueError for one that is a close misspelling of a key Tempered reads."""
    read, ignored = KEYS[within]
    unknown = [key for key in table if key not in read and key not in ignored]
    _misspelt({key: table[key] for key in unknown}, within, read)
    return [f"{within}.{key}" if within else key for key in unknown]


def _misspelt(table: dict[str, Any], within: str, read: tuple[str, ...]) -> None:
    """ValueError for a key of `table` (task.toml's top, or [`within`]) that is not one of
    `read` but a close misspelling of one (`CLOSE`): `[metadata] spilt = "heldout"` once
    loaded as split train, a held-out task trained on."""
    for key in table:
        if key in read:
            continue
        if meant := difflib.get_close_matches(key, read, n=1, cutoff=CLOSE):
            where = f"[{within}] " if within else ""
            raise ValueError(f"{where}{key}: no such key; did you mean {meant[0]}?")


def _env_value(key: str, value: Any) -> str:
    """A [verifier.env] variable's value as the test script gets it; ValueError naming it
    where no process could be given it (bwrap's --setenv once failed on `C=D`, and a NUL
    stopped `tasks validate` for every task)."""
    if not ENV_KEY.fullmatch(key):
        raise ValueError(
            f"[verifier.env] {key!r} is not a variable name (letters, digits and _, not first "
            "a digit)"
        )
    if isinstance(value, bool):
        return "true" if value else "false"  # as TOML spells it
    if not isinstance(value, str | int | float):
        raise ValueError(
            f"[verifier.env] {key}: a string, a number or a boolean, not {_kind(value)}"
        )
    if "\0" in (text := str(value)):
        raise ValueError(f"[verifier.env] {key}: a NUL character")
    return text


def _kind(value: Any) -> str:
    """The TOML type of `value`, for an error."""
    kinds = {bool: "a boolean", str: "a string", int: "an integer", float: "a float"}
    kinds |= {list: "an array", dict: "a table"}
    if isinstance(value, datetime.date | datetime.time):
        return "a date or time"
    return kinds.get(type(value), type(value).__name__)


def _table(config: dict[str, Any], key: str, within: str = "") -> dict[str, Any]:
    table = config.get(key, {})
    if not isinstance(table, dict):
        raise ValueError(f"[{within}{key}] is not a table")
    return table
