"""The Dockerfile of a Harbor task (`infra/tasks/harbor.py`) read as a file tree, not built.

    workdir, files, env = read_dockerfile(Path("task/environment/Dockerfile"))
    # "/app", {"src/main.py": File(...)} (relative to the workdir), {"KEY": "value"}
    workspace, own = Budget(256), Budget.own()  # the workspace's MB; the task's other files
    workdir, files, env = read_dockerfile(Path("task/environment/Dockerfile"), workspace, own)
    tests = tree(Path("task/tests"), own)       # mounted at /tests, not in the workspace

The local and gVisor backends run a task's environment over the host's read-only system, so
only these instructions are understood, as Docker reads them (a UTF-8 BOM, comments and
continued lines too):

    FROM       the base image: ignored (one only; multi-stage builds are an error)
    WORKDIR    quotes removed, `$VAR`/`${VAR}` expanded, relative to the previous one (the
               first absolute: Docker takes a relative one from the base image's WORKDIR,
               which is not read); the workspace is the last one (/app when none: Harbor's
               convention), outside the sandbox's system and
               outside the trees the verifier mounts (/tests, /logs/verifier, /solution)
               and no parent of one (/logs)
    COPY       build-context files into the workspace, sources relative to the context (a
               leading `/` too), globs as pathlib reads them (one matching nothing is an error);
               several sources or matches, a destination ending in `/`, or one that is a
               directory already take the files into it; a directory copies its contents;
               its words quoted and expanded as ENV's (`'$D'` is `$D`), one empty after
               expansion an error; `--chown`/`--link` ignored, `--chmod=OCTAL` applied, any
               other flag (`--from`, `--exclude`, `--parents`) and heredocs (`<<EOF`) an error
               (`infra/tasks/harbor_copy.py`); an error beside a `.dockerignore` (or
               `Dockerfile.dockerignore`) with a pattern: its patterns are not read, and what
               it keeps out would land in the workspace
    ENV        KEY=value words (or the legacy KEY value), quoted and expanded as Docker does

Anything else is a TaskInputError naming the file and line: another instruction, a file COPY
would put where a directory is (or below a file), a file outside the final workspace, a glob
pathlib refuses, a NUL character, a source outside the context or unreadable. What cannot be
taken from a copied directory (`tree`: a link in it, a directory or file it cannot read) is
an error naming that path.

Every file is read through a `Budget`: looked at before it is read
(`verifier_files.read_regular`: a FIFO is no file, never waited on), and refused, unread and
named, where it would take more than its budget. The files COPY puts in the workspace take a
workspace's size in all (`MAX_TASK_MB`, `sandbox.workspaces.max_workspace_mb`'s default, unless
the caller gives another): a task that large could not be restored into one anyway. The task's
other files (the Dockerfile, and harbor.py's task.toml, instruction.md, tests/ and solution/)
are never in the workspace; they take `MAX_TASK_FILES_MB` in all, so that no task takes the
loader's memory, and tests/ and solution/ each a workspace's size (`Budget.tree`: restored into
a scratch of that size to verify or solve). A name that is not UTF-8 is an error (`utf8_name`).
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from contracts.task import WorkspaceSpec
from infra.environments.checks import TESTS_DIR
from infra.environments.tree import File
from infra.environments.verifier_files import (
    LOGS_DIR,
    FileTooLarge,
    NotARegularFile,
    read_regular,
)
from infra.environments.workspace import SOLUTION_DIR
from infra.sandbox.workspace import check_mount_point
from infra.settings import WorkspaceSettings
from infra.tasks.harbor_copy import copy_words, matches
from infra.tasks.harbor_words import env_pairs, shell_words

DEFAULT_WORKDIR = "/app"
INSTRUCTIONS = {"FROM", "WORKDIR", "COPY", "ENV"}
VERIFIER_DIRS = (TESTS_DIR, LOGS_DIR, SOLUTION_DIR)
"""Where the verifier (and the solution's run) mount trees of their own: a workspace there or
below would be hidden by them, and a correct solution would score 0; a workspace above one
(`/logs`) would let the agent put a file or a link where the mount goes, and every verify of
its tree would fail as the platform's fault."""
MAX_TASK_MB: int = WorkspaceSettings.model_fields["max_workspace_mb"].default
"""What the files COPY puts in a workspace may take in all, by default: a workspace's
default size."""
MAX_TASK_FILES_MB = 1024
"""What a task's files outside the workspace may take in all: a cap on the loader's memory,
generous (a task's tests may hold fixtures), not a size any backend needs."""
_CONTINUED = re.compile(r"\\[ \t]*$")
"""A line's end that continues it on the next (Docker's escape, spaces or tabs after it)."""
_WORKDIR = TypeAdapter(Annotated[str, WorkspaceSpec.model_fields["workdir"]])


class TaskInputError(ValueError):
    """A task directory that cannot be loaded; the message names the task and the file."""


class Budget:
    """The bytes a task's files may still take; `read` takes a file's from it (and from the
    budget it is `within`). `Budget(mb)` is a workspace's, `Budget.own()` that of the task's
    files outside it, `Budget.tree(...)` that of tests/ or solution/ (a workspace's size each,
    within the task's own); `past` says what a file too many would take past, for the error."""

    def __init__(
        self, max_mb: int = MAX_TASK_MB, past: str = "", within: Budget | None = None
    ) -> None:
        self.left, self.within = max_mb << 20, within
        self.past = past or f"the workspace's files would take more than a workspace's {max_mb} MB"

    @classmethod
    def own(cls) -> Budget:
        return cls(
            MAX_TASK_FILES_MB,
            "the task's own files (task.toml, instruction.md, the Dockerfile, tests/, "
            f"solution/) would take more than {MAX_TASK_FILES_MB} MB, the most the loader reads",
        )

    @classmethod
    def tree(cls, name: str, max_mb: int, own: Budget) -> Budget:
        """tests/'s or solution/'s: each is restored into a scratch of a workspace's size (the
        verifier's, the solve's), so a larger one could never be verified or run."""
        past = (
            f"{name}/ would take more than a workspace's {max_mb} MB, the most the scratch it "
            "is restored into (to verify or to solve) holds"
        )
        return cls(max_mb, past, own)

    def read(self, path: Path, *, follow_links: bool = True) -> bytes:
        """`path`'s bytes, looked at before they are read; TaskInputError naming it where it
        is no regular file or would not fit, the OSError of a file that cannot be read."""
        tightest = self
        if self.within is not None and self.within.left < self.left:
            tightest = self.within
        try:
            data = read_regular(path, tightest.left, follow_links=follow_links)
        except FileTooLarge as exc:
            raise TaskInputError(f"{path}: {exc.size} bytes: {tightest.past}") from None
        except NotARegularFile:
            raise TaskInputError(f"{path}: not a regular file") from None
        self.left -= len(data)
        if self.within is not None:
            self.within.left -= len(data)
        return data


def read_dockerfile(
    path: Path, budget: Budget | None = None, own: Budget | None = None
) -> tuple[str, dict[str, File], dict[str, str]]:
    """(WORKDIR, the workspace's files, ENV) of a Dockerfile that only uses FROM, WORKDIR, COPY
    and ENV, the files COPY takes read within `budget` (a fresh one: `MAX_TASK_MB`), the
    Dockerfile within `own` (a fresh `Budget.own()`); TaskInputError naming the file and line
    otherwise."""
    budget, own = budget or Budget(), own or Budget.own()
    context = path.parent
    workdir, env = DEFAULT_WORKDIR, dict[str, str]()
    workdir_line = 0
    placed: dict[str, tuple[int, File]] = {}  # absolute path → (the line that put it, file)
    dirs = {"/", DEFAULT_WORKDIR}  # the directories so far, each one's parents too: the
    # workdir's (every WORKDIR line makes its own), the ones COPY made
    froms = 0
    ignored = _dockerignore(path, own)
    for number, instruction, arguments in _instructions(path, own):

        def fail(why: str, number: int = number) -> TaskInputError:
            return TaskInputError(f"{path}:{number}: {why}")

        if instruction not in INSTRUCTIONS:
            raise fail(
                f"{instruction} is not supported: the local and gVisor backends understand only "
                f"{', '.join(sorted(INSTRUCTIONS))} (the base image's files are the host's)"
            )
        if instruction == "FROM":
            froms += 1
            if froms > 1:
                raise fail("multi-stage builds (a second FROM) are not supported")
        elif instruction == "WORKDIR":
            path_words = shell_words(arguments, env, fail, split=False)  # one path, spaces too
            if not path_words or not path_words[0]:
                raise fail("WORKDIR needs a path")
            if not workdir_line and not path_words[0].startswith("/"):
                raise fail(
                    f"WORKDIR {path_words[0]!r} is relative, and no WORKDIR before it: Docker "
                    "takes it from the base image's WORKDIR, which this loader does not read; "
                    "give an absolute path (e.g. /app)"
                )
            workdir = _absolute(workdir, path_words[0])
            try:
                check_mount_point(_WORKDIR.validate_python(workdir))
            except ValidationError as exc:
                raise fail(f"WORKDIR {workdir!r}: {exc.errors()[0]['msg']}") from None
            except ValueError as exc:
                raise fail(f"WORKDIR {exc}") from None
            _make_dirs(workdir, placed, dirs, fail)
            workdir_line = number
        elif instruction == "ENV":
            env.update(env_pairs(arguments, env, fail))
        else:
            if ignored is not None:
                raise fail(
                    f"COPY with {ignored} beside it: its patterns are not read by this loader, "
                    "and the files it keeps out would land in the workspace; delete it and "
                    "COPY only the files the agent should get"
                )
            mode, sources, destination = copy_words(arguments, env, fail)
            target = _absolute(workdir, destination)
            found = [match for source in sources for match in matches(context, source, fail)]
            into = destination.endswith("/") or len(found) > 1 or target in dirs
            for match in found:
                if match.is_dir():
                    _make_dirs(target, placed, dirs, fail)
                for absolute, file in _copy(match, target, into, budget).items():
                    if mode is not None:  # --chmod: what it says, not the context's mode
                        file = File(file.data, bool(mode & 0o111))
                    if absolute in dirs:
                        raise fail(f"COPY puts a file at {absolute}, a directory already")
                    _make_dirs(posixpath.dirname(absolute), placed, dirs, fail)
                    placed[absolute] = (number, file)
    for mounted in VERIFIER_DIRS:
        if workdir == mounted or workdir.startswith(mounted + "/"):
            raise TaskInputError(
                f"{path}:{workdir_line}: WORKDIR {workdir!r} lies in {mounted}, mounted over "
                f"the workspace to verify or solve (none of {', '.join(VERIFIER_DIRS)} may "
                "hold it)"
            )
        if mounted.startswith(workdir + "/"):  # the agent could put a file or a link there
            raise TaskInputError(
                f"{path}:{workdir_line}: WORKDIR {workdir!r} holds {mounted}, where the "
                "verifier mounts a tree of its own: the agent could make it a file or a link "
                f"and break the mount (no parent of {', '.join(VERIFIER_DIRS)} may be it)"
            )
    tree: dict[str, File] = {}
    for absolute, (number, file) in placed.items():
        if not absolute.startswith(workdir.rstrip("/") + "/"):
            raise TaskInputError(
                f"{path}:{number}: COPY to {absolute} lies outside the workspace {workdir}"
            )
        tree[posixpath.relpath(absolute, workdir)] = file
    return workdir, tree, env


def _absolute(directory: str, path: str) -> str:
    """`path` from `directory`, normalised (`//x` is `/x`, as Docker reads it)."""
    return posixpath.normpath("/" + posixpath.join(directory, path).lstrip("/"))


def _make_dirs(
    directory: str, placed: dict[str, Any], dirs: set[str], fail: Callable[[str], Exception]
) -> None:
    """Record `directory` and its parents as directories; an error where one is a file."""
    while directory not in dirs:
        if directory in placed:
            raise fail(f"{directory} is a file an earlier COPY put there, not a directory")
        dirs.add(directory)
        directory = posixpath.dirname(directory)


def _dockerignore(path: Path, own: Budget) -> Path | None:
    """The ignore file Docker reads beside the Dockerfile `path` (`Dockerfile.dockerignore`
    before `.dockerignore`, as BuildKit) where it holds a pattern (a line neither blank nor a
    `#` comment), read within `own`; None where there is none. One that is no regular file (a
    link) or not UTF-8 is an error naming it."""
    for ignore in (path.parent / f"{path.name}.dockerignore", path.parent / ".dockerignore"):
        if not os.path.lexists(ignore):
            continue
        try:
            lines = own.read(ignore, follow_links=False).decode("utf-8-sig").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise TaskInputError(f"{ignore}: unreadable ({exc})") from None
        patterns = any(line.strip() and not line.lstrip().startswith("#") for line in lines)
        return ignore if patterns else None
    return None


def _instructions(path: Path, budget: Budget) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments), comments and blank lines dropped, continued lines
    joined as Docker joins them: the backslash (and the spaces after it) dropped, the next line
    kept as it is, its leading spaces too, nothing added (`/ap\\` + `p` is `/app`); a comment
    or blank line inside a continued line is passed over."""
    try:
        lines = budget.read(path, follow_links=False).decode("utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskInputError(f"{path}: unreadable ({exc})") from None
    result: list[tuple[int, str, str]] = []
    pending: str | None = None  # the continued line so far; None: no line is continued
    start = 0
    for number, line in enumerate(lines, 1):
        if "\0" in line:
            raise TaskInputError(f"{path}:{number}: a NUL character")
        if not line.strip() or line.lstrip().startswith("#"):
            continue  # inside a continued line too, as Docker reads it
        if pending is None:
            start, pending, line = number, "", line.lstrip()
        if continued := _CONTINUED.search(line):
            pending += line[: continued.start()]
            continue
        text, pending = pending + line, None
        instruction, *arguments = text.split(None, 1)
        result.append((start, instruction.upper(), "".join(arguments).strip()))
    if pending is not None:
        raise TaskInputError(f"{path}:{start}: the file ends inside a continued line")
    return result


def _copy(match: Path, target: str, into: bool, budget: Budget) -> dict[str, File]:
    """The files COPY puts at or under `target` (absolute paths) from `match`: a directory's
    contents, or a file (into `target` as a directory where `into`, else at `target`)."""
    if match.is_dir():
        files = tree(match, budget)
        return {posixpath.join(target, relative): file for relative, file in files.items()}
    utf8_name(match)
    destination = posixpath.join(target, match.name) if into else target
    return {destination: read_file(match, budget)}


def tree(root: Path, budget: Budget) -> dict[str, File]:
    """Every file under `root`, by relative path, read within `budget`; TaskInputError naming
    a directory that cannot be listed, a link (not followed: its target may lie anywhere on
    the host) or a file that cannot be read. pathlib's `rglob` passed over the first two
    without a word, and the task ran without the files its author gave it."""
    files: dict[str, File] = {}
    pending = [root]  # a stack, not recursion: a hostile tree may be deeper than Python's limit
    while pending:
        directory = pending.pop()
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError as exc:
            raise TaskInputError(f"{directory}: unreadable ({exc.strerror or exc})") from None
        for entry in entries:
            path = Path(entry.path)
            try:
                link, subdirectory = entry.is_symlink(), entry.is_dir(follow_symlinks=False)
            except OSError as exc:
                raise TaskInputError(f"{path}: unreadable ({exc.strerror or exc})") from None
            if link:
                raise TaskInputError(f"{path}: is a link: a task's files must lie in its directory")
            utf8_name(path)
            if subdirectory:
                pending.append(path)
            else:  # a FIFO or socket too: `Budget.read` refuses it, naming it
                files[path.relative_to(root).as_posix()] = read_file(path, budget)
    return dict(sorted(files.items()))


def read_file(path: Path, budget: Budget) -> File:
    try:
        return File(budget.read(path), bool(path.stat().st_mode & 0o111))
    except OSError as exc:
        raise TaskInputError(f"{path}: unreadable ({exc.strerror or exc})") from None


def utf8_name(path: Path) -> None:
    """TaskInputError, the path shown escaped (`caf\\xe9.txt`), where `path`'s name is not
    UTF-8: no tree can hold it (once its manifest failed to serialise, and the whole suite's
    load with it)."""
    try:
        path.name.encode("utf-8")
    except UnicodeEncodeError:
        raise TaskInputError(
            f"{escaped(str(path))}: the name is not UTF-8: a task's file names must be"
        ) from None


def escaped(text: str) -> str:
    """`text` with what is not UTF-8 (a name's undecodable bytes) as `\\xNN` escapes."""
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a surrogate no file name decodes to
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
