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
ignored), WORKDIR, COPY (build-context files into the workspace; a glob that matches nothing is
an error, and several sources or matches go into the destination as a directory;
`--chown`/`--chmod` ignored) and ENV (`$VAR` and `${VAR}` expand); any other instruction is an
error naming the file and line. A task with bad input (no instruction.md, an unreadable
task.toml, a Dockerfile it cannot use) is reported with its directory and file, and the other
tasks still load.

Not covered: images (the Kubernetes backend's business), multi-stage builds, `.dockerignore`.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from contracts.common import describe_validation_error, is_identifier
from infra.environments.tree import Check, File
from infra.sandbox.workspace import BASE_ENV, check_mount_point
from infra.tasks.workspace_task import WorkspaceTask, workspace_task

PREFIX = "harbor:"
DEFAULT_WORKDIR = "/app"
INSTRUCTIONS = {"FROM", "WORKDIR", "COPY", "ENV"}
_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class TaskInputError(ValueError):
    """A task directory that cannot be loaded; the message names the task and the file."""


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
    for part in ("", "tests", "tests/test.sh", "solution", "environment", "environment/Dockerfile"):
        if (directory / part).is_symlink():  # its target may lie anywhere: read it as a copy
            raise fail(part or ".", "is a link: a task's files must lie in its directory")
    if not (directory / "tests" / "test.sh").is_file():
        raise fail("tests/test.sh", "missing: the check that writes /logs/verifier/reward.txt")
    dockerfile = directory / "environment" / "Dockerfile"
    if not dockerfile.is_file():
        raise fail("environment/Dockerfile", "missing")
    try:
        workdir, files, env = read_dockerfile(dockerfile)
        verifier = _table(config, "verifier")
        metadata = _table(config, "metadata")
        check = Check(
            kind="script",
            tests="test.sh",
            timeout_s=verifier.get("timeout_sec"),
            env={str(k): str(v) for k, v in _table(verifier, "env", "verifier.").items()},
        )
        return workspace_task(
            name,
            prompt,
            files,
            _tree(directory / "tests"),
            check,
            solution=_tree(directory / "solution") if (directory / "solution").is_dir() else None,
            workdir=workdir,
            env_vars=env,
            suite=suite,
            split=metadata.get("split", "train"),
        )
    except ValidationError as exc:
        raise fail("task.toml", describe_validation_error(exc)) from None
    except TaskInputError as exc:
        raise TaskInputError(f"task {name}: {exc}") from None


def _table(config: dict[str, Any], key: str, within: str = "") -> dict[str, Any]:
    table = config.get(key) or {}
    if not isinstance(table, dict):
        raise TaskInputError(f"task.toml: [{within}{key}] is not a table")
    return table


def _tree(root: Path) -> dict[str, File]:
    """Every regular file under `root` (links are not followed), by relative path."""
    return {
        path.relative_to(root).as_posix(): File(
            path.read_bytes(), bool(path.stat().st_mode & 0o111)
        )
        for path in sorted(root.rglob("*"))
        if path.is_file() and not path.is_symlink()
    }


def read_dockerfile(path: Path) -> tuple[str, dict[str, File], dict[str, str]]:
    """(WORKDIR, the workspace's files, ENV) of a Dockerfile that only uses FROM, WORKDIR, COPY
    and ENV; TaskInputError naming the file and line otherwise."""
    context = path.parent
    workdir, env = DEFAULT_WORKDIR, dict[str, str]()
    copies: list[tuple[int, str, dict[str, File]]] = []
    froms = 0
    for number, instruction, arguments in _instructions(path):

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
            workdir = posixpath.normpath(posixpath.join(workdir, _expand(arguments, env)))
            try:
                check_mount_point(workdir)
            except ValueError as exc:
                raise fail(f"WORKDIR {exc}") from None
        elif instruction == "ENV":
            env.update(_env(arguments, env, fail))
        else:
            words = _words(arguments, fail)
            if any(word.startswith("--from") for word in words):
                raise fail("COPY --from (multi-stage) is not supported")
            words = [word for word in words if not word.startswith("--")]
            if len(words) < 2:
                raise fail("COPY needs a source and a destination")
            *sources, destination = (_expand(word, env) for word in words)
            target = posixpath.normpath(posixpath.join(workdir, destination))
            matches = [match for source in sources for match in _matches(context, source, fail)]
            into = destination.endswith("/") or len(matches) > 1 or target == workdir
            files = {}
            for match in matches:
                files.update(_copy(match, target, into))
            copies.append((number, target, files))
    tree: dict[str, File] = {}
    for number, target, files in copies:
        for absolute, file in files.items():
            if not absolute.startswith(workdir.rstrip("/") + "/"):
                raise TaskInputError(
                    f"{path}:{number}: COPY to {target} lies outside the workspace {workdir}"
                )
            tree[posixpath.relpath(absolute, workdir)] = file
    return workdir, tree, env


def _instructions(path: Path) -> list[tuple[int, str, str]]:
    """(line number, INSTRUCTION, arguments), continuation lines joined, comments dropped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskInputError(f"{path}: unreadable ({exc})") from None
    result, pending, start = [], "", 0
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # inside a continued line too, as Docker reads it
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text, pending = pending + stripped, ""
        instruction, _, arguments = text.partition(" ")
        result.append((start, instruction.upper(), arguments.strip()))
    if pending:
        raise TaskInputError(f"{path}:{start}: the file ends inside a continued line")
    return result


def _words(arguments: str, fail: Any) -> list[str]:
    if arguments.startswith("["):
        try:
            words = json.loads(arguments)
        except ValueError:
            words = None
        if isinstance(words, list) and all(isinstance(word, str) for word in words):
            return words
    return _split(arguments, fail)


def _split(arguments: str, fail: Any) -> list[str]:
    try:
        return shlex.split(arguments)
    except ValueError as exc:  # an unclosed quote: the instruction's error, not the loader's
        raise fail(f"{exc.args[0].lower()} in {arguments!r}") from None


def _expand(text: str, env: dict[str, str]) -> str:
    scope = {**BASE_ENV, **env}
    return _VARIABLE.sub(lambda m: scope.get(m.group(1) or m.group(2), ""), text)


def _env(arguments: str, env: dict[str, str], fail: Any) -> dict[str, str]:
    first, *rest = re.split(r"\s+", arguments.strip(), maxsplit=1)
    if not first:
        raise fail("ENV needs KEY=value")
    if "=" not in first:  # the legacy form: ENV KEY value with spaces
        whole = _shell_words(rest[0] if rest else "", env, fail, split=False)
        if not _KEY.fullmatch(first) or not whole:
            raise fail(f"ENV {arguments!r} is neither KEY=value nor KEY value")
        return {first: whole[0]}
    pairs: dict[str, str] = {}
    for word in _shell_words(arguments, env, fail):
        key, equals, value = word.partition("=")
        if not equals or not _KEY.fullmatch(key):
            raise fail(f"ENV {word!r} is not KEY=value")
        pairs[key] = value  # as Docker: expanded from what the lines before set, not this one
    return pairs


def _shell_words(text: str, env: dict[str, str], fail: Any, split: bool = True) -> list[str]:
    """Docker's processing of ENV words: quotes removed, `$VAR` and `${VAR}` expanded except in
    single quotes, a backslash escapes the next character (in double quotes only `"`, `$` and
    a backslash); words split at unquoted whitespace unless `split` is false."""
    scope = {**BASE_ENV, **env}
    words: list[str] = []
    word: list[str] | None = None  # None: between words
    quote, i = "", 0
    while i < len(text):
        char = text[i]
        if char.isspace() and split and not quote:
            if word is not None:
                words.append("".join(word))
            word, i = None, i + 1
            continue
        word = [] if word is None else word
        variable = _VARIABLE.match(text, i) if char == "$" and quote != "'" else None
        if variable:
            word.append(scope.get(variable.group(1) or variable.group(2), ""))
            i = variable.end()
            continue
        escapes = quote == "" or (quote == '"' and text[i + 1 : i + 2] in ('"', "$", "\\"))
        if char == "\\" and quote != "'" and escapes and i + 1 < len(text):
            word.append(text[i + 1])
            i += 2
            continue
        if char == quote:
            quote = ""
        elif char in "'\"" and not quote:
            quote = char
        else:
            word.append(char)
        i += 1
    if quote:
        raise fail(f"no closing quotation in {text!r}")
    return words if word is None else [*words, "".join(word)]


def _matches(context: Path, source: str, fail: Any) -> list[Path]:
    """What COPY `source` names in the build `context`: the path, or a glob's matches (sorted)."""
    if not any(c in source for c in "*?["):
        matches = [context / source]
    elif not (matches := sorted(context.glob(source))):
        raise fail(f"COPY {source}: no file in {context} matches")
    for match in matches:
        if not match.resolve().is_relative_to(context.resolve()):
            raise fail(f"COPY {source} lies outside the build context {context}")
        if not match.exists():
            raise fail(f"COPY {source}: no such file in {context}")
    return matches


def _copy(match: Path, target: str, into: bool) -> dict[str, File]:
    """The files COPY puts at or under `target` (absolute paths) from `match`: a directory's
    contents, or a file (into `target` as a directory where `into`, else at `target`)."""
    if match.is_dir():
        return {posixpath.join(target, relative): file for relative, file in _tree(match).items()}
    destination = posixpath.join(target, match.name) if into else target
    return {destination: File(match.read_bytes(), bool(match.stat().st_mode & 0o111))}
