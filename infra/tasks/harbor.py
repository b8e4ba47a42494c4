"""Harbor task directories as `workspace` tasks (`--suite harbor:PATH`).

    tasks, errors = load_harbor("examples/harbor")    # a task directory, or a directory of them;
                                                      # errors: {directory name: why it failed}

A task directory (Harbor's layout):

    task.toml            [verifier] timeout_sec, env; [metadata] split = "train"|"heldout"
    instruction.md       the prompt
    environment/         Dockerfile + build context: the initial workspace
    tests/test.sh        the check: writes a number in [0, 1] to /logs/verifier/reward.txt
                         (or reward.json: `verifier_files`); run by its #! line's interpreter
    solution/solve.sh    optional reference solution (run by `tempered tasks validate`)

Paths are Harbor's: the workspace at the Dockerfile's WORKDIR (/app when it sets none), the
tests at /tests (read-only, only while verifying), the solution at /solution, the verifier's
output under /logs/verifier. The local and gVisor backends run a task's environment as a
file tree over the host's read-only system, so the Dockerfile may only use FROM (the base is
ignored), WORKDIR, COPY and ENV, read as Docker reads them (`infra/tasks/harbor_dockerfile.py`
says how far); anything else in it is an error naming the file and line.

task.toml is Harbor's, read by `infra/tasks/harbor_toml.py` (which says which keys): its
[verifier] timeout_sec and env make the check, [metadata] split the task's split, and
[environment] memory_mb (or the older memory = "4G") the memory of the agent's commands and of
the check (`WorkspaceSpec.memory_mb`; past a sandbox's bounds, the task's error); a limit
Harbor has and Tempered does not apply ([environment] cpus, storage_mb, ..., [agent]
timeout_sec) is one warning each, naming the task, the key and its value; keys Harbor does not
have are one warning per task naming them.

A task with bad input is reported with its directory and file (and line), and the other tasks
still load: no task.toml (a directory holding any of task.toml, instruction.md, tests/ or
Terminal-Bench's task.yaml is a task's; one with none of them, such as docs/, is passed over),
no instruction.md, an unreadable task.toml or one with a bad field, a task file or directory
that is a link (task.toml, instruction.md, tests/, tests/test.sh, solution/, environment/, the
Dockerfile, anything in tests/, solution/ or a directory COPY takes: its target may lie anywhere
on the host), a task file that is no regular file (a FIFO is never waited on), files past their
size (below), a Dockerfile it cannot use (a bad WORKDIR or file tree is the Dockerfile's error,
not task.toml's), a file or directory it cannot read (a mode of 000: the worker's uid is not
root everywhere), an empty tests/test.sh (blank: it could
write no reward), a tests/test.sh whose `#!` line no command can name (`checks.shebang`: longer
than the kernel reads, a NUL, not UTF-8) or that holds a CR (CRLF line endings: line 1). A
suite directory that cannot be listed is bad input (ValueError). The files COPY puts in the
workspace take at most `max_mb` in all, and the task's other files (task.toml, instruction.md,
the Dockerfile, tests/, solution/: never in the workspace)
`harbor_dockerfile.MAX_TASK_FILES_MB`, tests/ and solution/ each within `max_mb` too (the
verifier's and the solve's scratch is a workspace's size), each file looked at before it is read
(`harbor_dockerfile.Budget`). A file or directory name that is not UTF-8 (no tree can hold
it) is the task's error, shown escaped (`caf\\xe9.txt`), and so is a task directory's. A
directory holding task.toml and task directories too (beside its own environment/, tests/ and
solution/, whatever they hold) is refused whole: which was meant is not for the loader to guess.

Not covered: images (the Kubernetes backend's business), multi-stage builds, `.dockerignore`
(one with patterns makes every COPY the Dockerfile's error: harbor_dockerfile.py).
"""

from __future__ import annotations

import logging
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

from pydantic import ValidationError

from contracts.common import describe_validation_error, is_identifier
from infra.environments.checks import MAX_SHEBANG, InvalidTask, shebang
from infra.tasks.harbor_dockerfile import (
    MAX_TASK_MB,
    Budget,
    TaskInputError,
    escaped,
    read_dockerfile,
    tree,
)
from infra.tasks.harbor_toml import read_config
from infra.tasks.workspace_task import WorkspaceTask, workspace_task

__all__ = [
    "PREFIX",
    "TaskInputError",
    "harbor_dir",
    "harbor_tasks",
    "is_harbor",
    "load_harbor",
    "load_task",
    "read_dockerfile",
]

PREFIX = "harbor:"
_BLAME = {"workspace": "environment/Dockerfile", "": "environment/Dockerfile"}
"""The file at fault for a task's ValidationError, by its first field (`""`: a tree's, the
workspace's: tests/ and solution/ are directories, they cannot clash), else task.toml."""
LINKED = ("", "task.toml", "instruction.md", "tests", "tests/test.sh", "solution", "environment")
MARKERS = ("task.toml", "instruction.md", "tests", "task.yaml")
"""What makes a directory a task's (to load, or to report): Harbor's files, and
Terminal-Bench's task.yaml. A directory with none of them (docs/, .git/) is passed over."""
OWN_DIRS = ("environment", "tests", "solution")
"""A task directory's own directories: a task.toml in them is a fixture, not a task."""
log = logging.getLogger("tempered.tasks")


def is_harbor(suite: str) -> bool:
    return suite.startswith(PREFIX)


NEEDS_DIRECTORY = "harbor:DIR needs a directory"
"""The error of `harbor:` with no directory: it once read the working directory (`Path("")`)."""


def harbor_dir(suite: str) -> str:
    """The directory a `harbor:DIR` suite names; ValueError where it names none (empty or
    blank)."""
    directory = suite.removeprefix(PREFIX)
    if not directory.strip():
        raise ValueError(f"{NEEDS_DIRECTORY} (got {suite!r}): e.g. harbor:examples/harbor")
    return directory


def load_harbor(
    path: str | Path, *, max_mb: int = MAX_TASK_MB
) -> tuple[list[WorkspaceTask], dict[str, str]]:
    """The tasks under `path` (a task directory, or a directory of task directories, sorted)
    and, by directory name, one error line per task directory that could not be loaded (among
    them those whose workspace would take more than `max_mb` in all).

    `max_mb` is `sandbox.workspaces.max_workspace_mb`'s default: the suite loaders
    (`infra.tasks.load_suite` and its callers) have no settings at hand. A lower configured
    limit still fails such a task, at reset, as a workspace that does not fit."""
    tasks: list[WorkspaceTask] = []
    errors: dict[str, str] = {}
    for name, loaded in harbor_tasks(path, max_mb=max_mb):
        if isinstance(loaded, str):
            errors[name] = loaded
        else:
            tasks.append(loaded)
    return tasks, errors


def harbor_tasks(
    path: str | Path, *, max_mb: int = MAX_TASK_MB
) -> Iterator[tuple[str, WorkspaceTask | str]]:
    """`load_harbor`'s tasks one at a time, each loaded as it is reached, so that a caller
    that uploads them holds one task's files, not the suite's: (directory name, the task or
    its error line). ValueError, before the first, where `path` holds no task or cannot be
    listed, and where `path` is empty (`NEEDS_DIRECTORY`: not the working directory)."""
    if isinstance(path, str):
        harbor_dir(PREFIX + path)
    root = Path(path)
    try:
        if not root.is_dir():
            raise ValueError(f"{root}: no such directory of Harbor tasks")
        children = sorted(child for child in root.iterdir() if _is_task_dir(child))
        if (root / "task.toml").is_symlink() or (root / "task.toml").exists():
            if children := [child for child in children if child.name not in OWN_DIRS]:
                names = ", ".join(child.name for child in children[:5])
                raise ValueError(
                    f"{root}: holds task.toml and task directories too ({names}): name one "
                    "task directory, or a directory of them without a task.toml of its own"
                )
            children = [root]
        elif not children and _is_task_dir(root):
            children = [root]  # a task directory named alone, without its task.toml
    except OSError as exc:  # the suite's directory itself: bad input, not retried
        raise ValueError(f"{exc.filename or root}: unreadable ({exc.strerror or exc})") from None
    if not children:
        raise ValueError(f"{root}: no Harbor task (a directory with task.toml) in it")
    for directory in children:
        name = escaped(directory.name)  # a name that is not UTF-8 as `\xe9`: printable
        try:
            yield name, load_task(directory, suite=f"{PREFIX}{path}", max_mb=max_mb)
        except TaskInputError as exc:
            yield name, " ".join(str(exc).splitlines())  # one line, as promised


def _is_task_dir(path: Path) -> bool:
    """Whether `path` is a directory holding any of a task's files (`MARKERS`; a link too, a
    dangling one as well): without a regular task.toml it is that task's error, not a
    directory to pass over. True for one that cannot be looked into: its error says why."""
    try:
        return path.is_dir() and any(
            (path / marker).is_symlink() or (path / marker).exists() for marker in MARKERS
        )
    except OSError:
        return True


def load_task(directory: Path, suite: str, *, max_mb: int = MAX_TASK_MB) -> WorkspaceTask:
    """One Harbor task directory as a workspace task, its workspace's files read within
    `max_mb` (and tests/ and solution/ each within a workspace of that size: the scratch each
    is restored into); TaskInputError naming the task and the file at fault, what is not UTF-8
    in its paths escaped (`\xe9`)."""
    name = directory.name
    if not is_identifier(name):
        raise TaskInputError(escaped(f"{directory}: the directory name is not a valid task id"))
    try:
        return _load(directory, name, suite, max_mb)
    except TaskInputError as exc:
        raise TaskInputError(escaped(f"task {name}: {exc}")) from None
    except OSError as exc:  # a look refused (a mode of 000): this task's error, not the suite's
        where = exc.filename or directory
        why = f"task {name}: {where}: unreadable ({exc.strerror or exc})"
        raise TaskInputError(escaped(why)) from None


def _load(directory: Path, name: str, suite: str, max_mb: int) -> WorkspaceTask:
    budget, own = Budget(max_mb), Budget.own()

    def fail(file: str, why: str) -> TaskInputError:
        return TaskInputError(f"{directory / file}: {why}")

    for part in (*LINKED, "environment/Dockerfile"):  # before any is read
        if (directory / part).is_symlink():  # its target may lie anywhere: read it as a copy
            raise fail(part or ".", "is a link: a task's files must lie in its directory")
    if not (directory / "task.toml").exists():
        yaml = " (task.yaml is Terminal-Bench's format, not Harbor's)"
        why = yaml if (directory / "task.yaml").exists() else ""
        raise fail("task.toml", f"missing: a Harbor task directory needs one{why}")
    try:
        text = own.read(directory / "task.toml", follow_links=False).decode("utf-8")
        config = tomllib.loads(text)
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise fail("task.toml", f"unreadable ({exc})") from None
    try:
        data = own.read(directory / "instruction.md", follow_links=False)
    except OSError as exc:
        raise fail("instruction.md", f"missing or unreadable ({exc.__class__.__name__})") from None
    try:
        prompt = data.decode("utf-8").strip()
    except UnicodeDecodeError as exc:
        raise fail("instruction.md", _not_utf8(exc)) from None
    if not prompt:
        raise fail("instruction.md", "empty")
    if not (directory / "tests" / "test.sh").is_file():
        raise fail("tests/test.sh", "missing: the check that writes the reward in /logs/verifier")
    dockerfile = directory / "environment" / "Dockerfile"
    if not dockerfile.is_file():
        raise fail("environment/Dockerfile", "missing")
    try:
        read = read_config(config)
    except ValidationError as exc:
        raise fail("task.toml", describe_validation_error(exc)) from None
    except ValueError as exc:
        raise fail("task.toml", str(exc)) from None
    if read.unknown:
        log.warning(
            "%s: keys Tempered does not know, ignored: %s",
            directory / "task.toml",
            ", ".join(read.unknown),
        )
    for line in read.unapplied:  # one each, naming the task: its run may fail for want of it
        log.warning("task %s: %s: %s", name, directory / "task.toml", line)
    try:
        workdir, files, env = read_dockerfile(dockerfile, budget, own)
        tests = tree(directory / "tests", Budget.tree("tests", max_mb, own))
        if not tests["test.sh"].data.strip():  # run, it would write no reward: every verify 0
            raise fail("tests/test.sh", "empty: the check must write the reward in /logs/verifier")
        if needed := _env_the_check_may_need(env, tests["test.sh"].data, read.check.env):
            log.warning(  # unlike Harbor's: a PATH or HOME into the workspace let it forge
                "task %s: %s: ENV %s: its commands have them, its check (tests/test.sh) does "
                "not: set what test.sh needs in [verifier.env] or in test.sh",
                name,
                dockerfile,
                ", ".join(needed),
            )
        try:  # a #! line no command can name fails every verify: said now, naming the file
            shebang(tests["test.sh"].data[:MAX_SHEBANG], "test.sh")
        except InvalidTask as exc:
            raise TaskInputError(f"{directory}/{exc}") from None
        if _crlf_shebang(tests["test.sh"].data):  # every verify would exit 127, scored 0
            raise fail(
                "tests/test.sh:1",
                "CRLF line ending (its #! line ends in \\r, which the kernel takes as part of the "
                "interpreter's name or argument: no such program): save it with LF line endings",
            )
        solution = None
        if (directory / "solution").is_dir():
            solution = tree(directory / "solution", Budget.tree("solution", max_mb, own))
        return workspace_task(
            name,
            prompt,
            files,
            tests,
            read.check,
            solution=solution,
            workdir=workdir,
            env_vars=env,
            memory_mb=read.memory_mb,  # within its bounds: `read_config` checked them
            suite=suite,
            split=read.split,
        )
    except ValidationError as exc:  # by the first field at fault (the split: task.toml)
        loc = exc.errors()[0]["loc"]
        file = _BLAME.get(str(loc[0]) if loc else "", "task.toml")
        raise fail(file, describe_validation_error(exc)) from None


_RESOLVING = re.compile(r"PATH|HOME|LD_\w+|PYTHON\w+|VIRTUAL_ENV|\w+_HOME")
"""ENV names that change what a command resolves to, used by test.sh whether it names them."""


def _env_the_check_may_need(env: dict[str, str], test: bytes, given: dict[str, str]) -> list[str]:
    """The Dockerfile's ENV names test.sh may rely on, which its check does not get (nor
    `given`, its `[verifier] env`): those it names (`$NAME`, `${NAME}`) and those that change
    what its commands resolve to."""
    text = test.decode(errors="replace")
    return sorted(
        key
        for key in env.keys() - given.keys()
        if _RESOLVING.fullmatch(key) or re.search(rf"\${{?{re.escape(key)}\b", text)
    )


def _crlf_shebang(script: bytes) -> bool:
    """Whether `script`'s `#!` line holds a carriage return (a file saved with CRLF endings)."""
    return script.startswith(b"#!") and b"\r" in script[:MAX_SHEBANG].partition(b"\n")[0]


def _not_utf8(exc: UnicodeDecodeError) -> str:
    """Where a file is not UTF-8: the byte, its offset, line and column (both from 1)."""
    data, at = exc.object, exc.start
    line_start = data.rfind(b"\n", 0, at) + 1
    line, column = data.count(b"\n", 0, at) + 1, at - line_start + 1
    return f"not UTF-8: byte {data[at]:#04x} at offset {at} (line {line}, column {column})"
