"""Task suites: the built-in `starter`, `humaneval`, `basics` and `workspace` suites, user JSONL
files, Harbor task directories, quarantine.

    from infra.tasks import load_suite, load_quarantine
    train = load_suite("starter", split="train")          # 120 tasks
    heldout = load_suite("starter", split="heldout")      # 80 tasks
    tasks = load_suite("harbor:examples/harbor")          # workspace tasks from Harbor dirs
    with_trees = load_workspace_suite("workspace")        # their trees too (for uploads)
    tools = load_suite("basics", split="train")           # 30 tool-use tasks (infra/tasks/basics.py)
    skip = load_quarantine(settings, "starter")           # ids `tempered tasks validate` flagged

A suite name is "starter", "humaneval", "basics", "workspace", "harbor:DIR" or a path to a `.jsonl` file
of `TaskSpec`s. `tempered tasks validate SUITE` (infra/tasks/validate.py, and
workspace_validate.py for workspace suites) writes the quarantine list.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

from contracts.task import TaskSpec
from infra.tasks.basics import basics_tasks
from infra.tasks.harbor import is_harbor, load_harbor
from infra.tasks.humaneval import humaneval_tasks
from infra.tasks.jsonl import read_jsonl
from infra.tasks.starter import starter_tasks
from infra.tasks.workspace import workspace_tasks
from infra.tasks.workspace_task import WorkspaceTask

if TYPE_CHECKING:
    from infra.settings import Settings

BUILTIN_SUITES = ("starter", "humaneval", "basics", "workspace")
WORKSPACE_SUITES = {"basics": basics_tasks, "workspace": workspace_tasks}
"""The built-in suites of `workspace` tasks (trees to upload, a solution to run)."""
SPLITS = ("train", "heldout")
SUITE_HELP = " | ".join((*BUILTIN_SUITES, "harbor:DIR", "FILE.jsonl"))
"""What a `--suite` option takes, for the CLI's help."""

__all__ = [
    "BUILTIN_SUITES",
    "SPLITS",
    "SUITE_HELP",
    "is_workspace_suite",
    "load_quarantine",
    "load_suite",
    "load_workspace_suite",
    "quarantine_path",
    "suite_key",
    "workspace_suite_and_errors",
]


log = logging.getLogger("tempered.tasks")


def _builtin(name: str) -> list[TaskSpec]:
    if name in WORKSPACE_SUITES:
        return [task.spec.model_copy(deep=True) for task in WORKSPACE_SUITES[name]()]
    return starter_tasks() if name == "starter" else humaneval_tasks()


def is_workspace_suite(name: str) -> bool:
    """Whether `name` is a suite of `workspace` tasks (trees to upload, a solution to run)."""
    return name in WORKSPACE_SUITES or is_harbor(name)


def load_workspace_suite(name: str, *, split: str | None = None) -> list[WorkspaceTask]:
    """The workspace tasks of suite `name` with their trees. Harbor task directories that
    cannot be loaded are logged (one line each, naming the task and file) and skipped;
    ValueError when none can be."""
    tasks, errors = workspace_suite_and_errors(name, split=split)
    for error in errors.values():
        log.warning("skipped a Harbor task: %s", error)
    return tasks


def workspace_suite_and_errors(
    name: str, *, split: str | None = None
) -> tuple[list[WorkspaceTask], dict[str, str]]:
    """`load_workspace_suite`'s tasks, and the Harbor task directories it could not load (by
    name: the error naming the file; whatever `split` is, as their split is unknown)."""
    _check_split(split)
    errors: dict[str, str] = {}
    if name in WORKSPACE_SUITES:
        tasks = list(WORKSPACE_SUITES[name]())
    elif is_harbor(name):
        tasks, errors = load_harbor(name.removeprefix("harbor:"))
        if not tasks:
            raise ValueError("no Harbor task could be loaded: " + "; ".join(errors.values()))
    else:
        raise ValueError(
            f"{name!r} is not a workspace suite ({', '.join(WORKSPACE_SUITES)} or harbor:DIR)"
        )
    return [task for task in tasks if split is None or task.spec.split == split], errors


def _check_split(split: str | None) -> None:
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)} (or none)")


def load_suite(name: str, *, split: str | None = None) -> list[TaskSpec]:
    """The tasks of suite `name` (all, or only `split`), in a stable order.

    ValueError (one line, naming the file, line and field for JSONL) on an unknown suite,
    an unreadable or invalid file, or an unknown split.
    """
    _check_split(split)
    if is_harbor(name):
        tasks = [task.spec for task in load_workspace_suite(name)]
    elif name in BUILTIN_SUITES:
        tasks = _builtin(name)
    elif name.endswith(".jsonl") or Path(name).is_file():
        if not Path(name).is_file():
            raise ValueError(f"{name}: no such task file")
        tasks = read_jsonl(name)
    else:
        raise ValueError(
            f"unknown suite {name!r}: use one of {', '.join(BUILTIN_SUITES)}, harbor:DIR or a "
            "path to a .jsonl file"
        )
    return [task for task in tasks if split is None or task.split == split]


def absolute_suite(suite: str) -> str:
    """`suite` spelled the same from any directory: a built-in name as it is, a JSONL file or
    `harbor:DIR` by its absolute path (the workers that load a run's suite run elsewhere)."""
    if suite in BUILTIN_SUITES:
        return suite
    prefix = "harbor:" if is_harbor(suite) else ""
    return f"{prefix}{Path(suite.removeprefix(prefix)).expanduser().resolve()}"


def suite_key(suite: str) -> str:
    """A file-name-safe key of a suite: built-in names as they are; a JSONL file or a Harbor
    directory by its name and a digest of its absolute path (by the stem alone, `a/tasks.jsonl`
    and `b/tasks.jsonl` shared one quarantine list, and `harbor:x` and `harbor:./x` had two)."""
    if suite in BUILTIN_SUITES:
        return suite
    absolute = absolute_suite(suite)
    path = Path(absolute.removeprefix("harbor:"))
    digest = hashlib.sha256(absolute.encode()).hexdigest()[:8]
    name = f"harbor_{path.name}" if is_harbor(absolute) else path.stem
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', name).lstrip('.') or 'suite'}-{digest}"


def quarantine_path(settings: Settings, suite: str) -> Path:
    """Where `tempered tasks validate` writes the quarantine list of `suite`."""
    return Path(settings.home) / "quarantine" / f"{suite_key(suite)}.json"


def load_quarantine(settings: Settings, suite: str) -> set[str]:
    """Ids training must skip for `suite` (empty when the suite was never validated)."""
    path = quarantine_path(settings, suite)
    if not path.is_file():
        return set()
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        return {str(task_id) for task_id in document["quarantined"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(
            f"{path}: not a quarantine list ({exc}); rerun `tempered tasks validate`"
        ) from None
