"""Harbor task directories as `workspace` tasks (`--suite harbor:PATH`).

    tasks, errors = load_harbor("examples/harbor")    # a task directory, or a directory of them;
                                                      # errors: {directory name: why it failed}

A task directory (Harbor's layout):

    task.toml            [verifier] timeout_sec, env; [metadata] split = "train"|"heldout"
    instruction.md       the prompt
    environment/         Dockerfile + build context: the initial workspace
    tests/test.sh        the check: writes a number in [0, 1] to /logs/verifier/reward.txt
    solution/solve.sh    optional reference solution (run by `tempered tasks validate`)

Paths are Harbor's: the workspace at the Dockerfile's WORKDIR (/app when it sets none), the
tests at /tests (read-only, only while verifying), the solution at /solution, the verifier's
output under /logs/verifier/. The local and gVisor backends run a task's environment as a
file tree over the host's read-only system, so the Dockerfile may only use FROM (the base is
ignored), WORKDIR, COPY and ENV, read as Docker reads them (`infra/tasks/harbor_dockerfile.py`
says how far); anything else in it is an error naming the file and line.

A task with bad input is reported with its directory and file (and line), and the other tasks
still load: no instruction.md, an unreadable task.toml or one with a bad field, a task file or
directory that is a link (task.toml, instruction.md, tests/, tests/test.sh, solution/,
environment/, the Dockerfile: its target may lie anywhere on the host), a Dockerfile it cannot
use (a bad WORKDIR or file tree is the Dockerfile's error, not task.toml's), a file it cannot
read.

Not covered: images (the Kubernetes backend's business), multi-stage builds, `.dockerignore`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from contracts.common import describe_validation_error, is_identifier
from infra.environments.tree import Check
from infra.tasks.harbor_dockerfile import TaskInputError, read_dockerfile, tree
from infra.tasks.workspace_task import WorkspaceTask, workspace_task

__all__ = ["PREFIX", "TaskInputError", "is_harbor", "load_harbor", "load_task", "read_dockerfile"]

PREFIX = "harbor:"
_BLAME = {"workspace": "environment/Dockerfile", "": "environment/Dockerfile"}
"""The file at fault for a task's ValidationError, by its first field (`""`: a tree's, the
workspace's: tests/ and solution/ are directories, they cannot clash), else task.toml."""
LINKED = ("", "task.toml", "instruction.md", "tests", "tests/test.sh", "solution", "environment")


def is_harbor(suite: str) -> bool:
    return suite.startswith(PREFIX)


def load_harbor(path: str | Path) -> tuple[list[WorkspaceTask], dict[str, str]]:
    """The tasks under `path` (a task directory, or a directory of task directories, sorted)
    and, by directory name, one error line per task directory that could not be loaded."""
    root = Path(path)
    if not root.is_dir():
        raise ValueError(f"{root}: no such directory of Harbor tasks")
    directories = [root] if (root / "task.toml").exists() else sorted(
        child for child in root.iterdir() if child.is_dir() and (child / "task.toml").exists()
    )  # fmt: skip
    if not directories:
        raise ValueError(f"{root}: no Harbor task (a directory with task.toml) in it")
    tasks: list[WorkspaceTask] = []
    errors: dict[str, str] = {}
    for directory in directories:
        try:
            tasks.append(load_task(directory, suite=f"{PREFIX}{path}"))
        except TaskInputError as exc:
            errors[directory.name] = str(exc)
    return tasks, errors


def load_task(directory: Path, suite: str) -> WorkspaceTask:
    """One Harbor task directory as a workspace task; TaskInputError naming the file at fault."""
    name = directory.name
    if not is_identifier(name):
        raise TaskInputError(f"{directory}: the directory name is not a valid task id")

    def fail(file: str, why: str) -> TaskInputError:
        return TaskInputError(f"task {name}: {directory / file}: {why}")

    for part in (*LINKED, "environment/Dockerfile"):  # before any is read
        if (directory / part).is_symlink():  # its target may lie anywhere: read it as a copy
            raise fail(part or ".", "is a link: a task's files must lie in its directory")
    try:
        config = tomllib.loads((directory / "task.toml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise fail("task.toml", f"unreadable ({exc})") from None
    try:
        prompt = (directory / "instruction.md").read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise fail("instruction.md", f"missing or unreadable ({exc.__class__.__name__})") from None
    if not prompt:
        raise fail("instruction.md", "empty")
    if not (directory / "tests" / "test.sh").is_file():
        raise fail("tests/test.sh", "missing: the check that writes /logs/verifier/reward.txt")
    dockerfile = directory / "environment" / "Dockerfile"
    if not dockerfile.is_file():
        raise fail("environment/Dockerfile", "missing")
    try:
        verifier = _table(config, "verifier")
        metadata = _table(config, "metadata")
        check = Check(
            kind="script",
            tests="test.sh",
            timeout_s=verifier.get("timeout_sec"),
            env={str(k): str(v) for k, v in _table(verifier, "env", "verifier.").items()},
        )
    except ValidationError as exc:
        raise fail("task.toml", describe_validation_error(exc)) from None
    except TaskInputError as exc:
        raise TaskInputError(f"task {name}: {exc}") from None
    try:
        workdir, files, env = read_dockerfile(dockerfile)
        return workspace_task(
            name,
            prompt,
            files,
            tree(directory / "tests"),
            check,
            solution=tree(directory / "solution") if (directory / "solution").is_dir() else None,
            workdir=workdir,
            env_vars=env,
            suite=suite,
            split=metadata.get("split", "train"),
        )
    except ValidationError as exc:  # by the first field at fault (the split: task.toml)
        loc = exc.errors()[0]["loc"]
        file = _BLAME.get(str(loc[0]) if loc else "", "task.toml")
        raise fail(file, describe_validation_error(exc)) from None
    except TaskInputError as exc:
        raise TaskInputError(f"task {name}: {exc}") from None


def _table(config: dict[str, Any], key: str, within: str = "") -> dict[str, Any]:
    table = config.get(key) or {}
    if not isinstance(table, dict):
        raise TaskInputError(f"task.toml: [{within}{key}] is not a table")
    return table
