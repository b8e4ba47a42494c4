"""Task suites: the built-in `starter`, `humaneval`, `basics` and `workspace` suites, user JSONL
files, Harbor task directories, quarantine.

    from infra.tasks import load_suite, load_quarantine
    train = load_suite("starter", split="train")          # 120 tasks
    heldout = load_suite("starter", split="heldout")      # 80 tasks
    tasks = load_suite("harbor:examples/harbor")          # workspace tasks from Harbor dirs
    with_trees = load_workspace_suite("workspace")        # their trees too (to validate)
    specs, unloadable = workspace_specs("workspace", store.put_bytes)  # their trees stored
    found, not_here = workspace_trees(load_suite("mixed.jsonl"))  # a JSONL's workspace tasks
    tools = load_suite("basics", split="train")           # 30 tool-use tasks (infra/tasks/basics.py)
    skip = load_quarantine(settings, "starter")           # ids `tempered tasks validate` flagged

A suite name is "starter", "humaneval", "basics", "workspace", "harbor:DIR" or a path to a `.jsonl` file
of `TaskSpec`s. `tempered tasks validate SUITE` (infra/tasks/validate.py, and
workspace_validate.py for workspace suites) writes the quarantine list. A JSONL file may hold
code and workspace tasks (`TaskSpec.env`); its workspace tasks name their trees by ref only, and
`workspace_trees` finds them among the built-in suites' (content-addressed: same ref, same tree).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from contracts.task import EnvName, TaskSpec
from infra.environments.tree import pack_files
from infra.environments.workspace import SOLVE
from infra.tasks.basics import basics_tasks
from infra.tasks.harbor import harbor_dir, harbor_tasks, is_harbor
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
UPLOADS = 2
"""Objects stored at once (`workspace_specs`): a task's two trees, its workspace and tests."""
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
    "workspace_specs",
    "workspace_suite_and_errors",
    "workspace_trees",
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
    _log_unloadable(errors)
    return tasks


def workspace_suite_and_errors(
    name: str, *, split: str | None = None
) -> tuple[list[WorkspaceTask], dict[str, str]]:
    """`load_workspace_suite`'s tasks, and the Harbor task directories it could not load (by
    name: the error naming the file; whatever `split` is, as their split is unknown)."""
    _check_split(split)
    tasks: list[WorkspaceTask] = []
    errors: dict[str, str] = {}
    for task_id, loaded in _workspace_suite(name):
        if isinstance(loaded, str):
            errors[task_id] = loaded
        elif split is None or loaded.spec.split == split:
            tasks.append(loaded)
    return tasks, errors


def workspace_trees(specs: list[TaskSpec]) -> tuple[list[WorkspaceTask], list[str]]:
    """The workspace tasks among `specs` (a JSONL suite's: refs, no trees) with their trees
    where this host has them (a built-in workspace suite's task with the same refs), and the
    ids of those whose trees it does not have (they are in some object store, or nowhere).
    Each keeps its own spec; its reference solution is the built-in's tree where its
    `canonical_solution` is the built-in's, else that script alone as solve.sh."""
    wanted = [spec for spec in specs if spec.env is EnvName.WORKSPACE]
    known = {
        (task.files.ref.key, task.tests.ref.key): task
        for suite in (WORKSPACE_SUITES.values() if wanted else ())
        for task in suite()
    }
    found: list[WorkspaceTask] = []
    missing: list[str] = []
    for spec in wanted:
        refs = (spec.workspace.files.key, spec.workspace.verifier.key) if spec.workspace else None
        task = known.get(refs) if refs else None
        if task is None:
            missing.append(spec.id)
            continue
        solution = task.solution
        if spec.canonical_solution != task.spec.canonical_solution:
            script = spec.canonical_solution
            solution = pack_files({SOLVE: script}) if script is not None else None
        found.append(WorkspaceTask(spec, task.files, task.tests, solution))
    return found, missing


def workspace_specs(
    name: str,
    put: Callable[[str, bytes], object] | None = None,
    *,
    keep: Callable[[TaskSpec], bool] = lambda spec: True,
) -> tuple[list[TaskSpec], dict[str, str]]:
    """The specs of workspace suite `name`'s tasks, and the Harbor task directories it could
    not load (logged; by name, one line each); ValueError as `load_workspace_suite`. With
    `put` (an object store's `put_bytes`), the trees of the tasks `keep` takes are stored
    through it (content-addressed: storing them again is a no-op), so that the refs in their
    specs name stored trees: the run's `load_tasks` and `tempered eval` do, before any task
    starts.

    One task at a time: each is loaded, its trees stored, and only its spec kept before the
    next is read. A suite's trees held all together (twice, in one dict to upload) could take
    more memory than a worker has: a Harbor task may hold a workspace's size."""
    specs: list[TaskSpec] = []
    errors: dict[str, str] = {}
    with ThreadPoolExecutor(UPLOADS) as pool:
        for task_id, loaded in _workspace_suite(name):
            if isinstance(loaded, str):
                errors[task_id] = loaded
                continue
            specs.append(loaded.spec)
            if put is not None and keep(loaded.spec):
                list(pool.map(lambda item: put(*item), loaded.objects.items()))
    _log_unloadable(errors)
    return specs, errors


def _workspace_suite(name: str) -> Iterator[tuple[str, WorkspaceTask | str]]:
    """Suite `name`'s tasks one at a time (Harbor's loaded as they are reached), by id: the
    task, or a Harbor task directory's error line. ValueError for a suite that is not a
    workspace suite, and after the last for a Harbor suite none of whose tasks loaded."""
    if name in WORKSPACE_SUITES:
        yield from ((task.spec.id, task) for task in WORKSPACE_SUITES[name]())
    elif is_harbor(name):
        errors, count = [], 0
        for task_id, loaded in harbor_tasks(harbor_dir(name)):
            count += 1
            if isinstance(loaded, str):
                errors.append(loaded)
            yield task_id, loaded
        if len(errors) == count:
            raise ValueError("no Harbor task could be loaded: " + "; ".join(errors))
    else:
        raise ValueError(
            f"{name!r} is not a workspace suite ({', '.join(WORKSPACE_SUITES)} or harbor:DIR)"
        )


def _log_unloadable(errors: dict[str, str]) -> None:
    for error in errors.values():
        log.warning("skipped a Harbor task: %s", error)


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
        tasks, _ = workspace_specs(name)
    elif name in BUILTIN_SUITES:
        tasks = _builtin(name)
    elif name.endswith(".jsonl") or Path(name).expanduser().is_file():
        if not (path := Path(name).expanduser()).is_file():  # `~` as in `absolute_suite`
            raise ValueError(f"{name}: no such task file")
        tasks = read_jsonl(path)
    else:
        raise ValueError(
            f"unknown suite {name!r}: use one of {', '.join(BUILTIN_SUITES)}, harbor:DIR or a "
            "path to a .jsonl file"
        )
    return [task for task in tasks if split is None or task.split == split]


def absolute_suite(suite: str) -> str:
    """`suite` spelled the same from any directory: a built-in name as it is, a JSONL file or
    `harbor:DIR` by its absolute path (the workers that load a run's suite run elsewhere);
    ValueError for `harbor:` with no directory (`harbor_dir`: not the working directory)."""
    if suite in BUILTIN_SUITES:
        return suite
    if is_harbor(suite):
        return f"harbor:{Path(harbor_dir(suite)).expanduser().resolve()}"
    return str(Path(suite).expanduser().resolve())


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
