"""Task suites: the built-in `starter` and `humaneval` suites, user JSONL files, quarantine.

    from infra.tasks import load_suite, load_quarantine
    train = load_suite("starter", split="train")          # 120 tasks
    heldout = load_suite("starter", split="heldout")      # 40 tasks
    skip = load_quarantine(settings, "starter")           # ids `tempered tasks validate` flagged

A suite name is "starter", "humaneval" or a path to a `.jsonl` file of `TaskSpec`s.
`tempered tasks validate SUITE` (infra/tasks/validate.py) writes the quarantine list.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from contracts.task import TaskSpec
from infra.tasks.humaneval import humaneval_tasks
from infra.tasks.jsonl import read_jsonl
from infra.tasks.starter import starter_tasks

if TYPE_CHECKING:
    from infra.settings import Settings

BUILTIN_SUITES = ("starter", "humaneval")
SPLITS = ("train", "heldout")

__all__ = [
    "BUILTIN_SUITES",
    "SPLITS",
    "load_quarantine",
    "load_suite",
    "quarantine_path",
    "suite_key",
]


def _builtin(name: str) -> list[TaskSpec]:
    return starter_tasks() if name == "starter" else humaneval_tasks()


def load_suite(name: str, *, split: str | None = None) -> list[TaskSpec]:
    """The tasks of suite `name` (all, or only `split`), in a stable order.

    ValueError (one line, naming the file, line and field for JSONL) on an unknown suite,
    an unreadable or invalid file, or an unknown split.
    """
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)} (or none)")
    if name in BUILTIN_SUITES:
        tasks = _builtin(name)
    elif name.endswith(".jsonl") or Path(name).is_file():
        if not Path(name).is_file():
            raise ValueError(f"{name}: no such task file")
        tasks = read_jsonl(name)
    else:
        raise ValueError(
            f"unknown suite {name!r}: use one of {', '.join(BUILTIN_SUITES)} or a path to a .jsonl file"
        )
    return [task for task in tasks if split is None or task.split == split]


def suite_key(suite: str) -> str:
    """A file-name-safe key of a suite: built-in names as they are, a JSONL path by its stem."""
    if suite in BUILTIN_SUITES:
        return suite
    stem = Path(suite).stem if suite.endswith(".jsonl") else suite
    return re.sub(r"[^A-Za-z0-9_.-]", "_", stem).lstrip(".") or "suite"


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
