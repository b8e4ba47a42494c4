"""A Harbor Dockerfile's COPY line read (`infra/tasks/harbor_dockerfile.py` puts its files):
its flags, its sources and destination, what each source names in the build context.

    mode, sources, destination = copy_words("--chmod=755 a.txt /app/run.sh", env, fail)
    # 0o755, ["a.txt"], "/app/run.sh"
    matches(context, "src/*.py", fail)  # the build-context paths a source names

Flags are read as Docker reads them, before the first source only (a later `--x` is a file's
name), their values expanded as ENV's words: `--chown` and `--link` ignored (the workspace's
files are the sandbox user's; `--link` changes only how an image is layered), `--chmod=OCTAL`
applied (a file is executable where the mode gives anyone x), anything else the caller's error:
`--from` (multi-stage), `--exclude` and `--parents` (the files would land other than Docker puts
them: an excluded answer key in the workspace), a symbolic `--chmod`, a flag Docker adds later.
A source or destination empty after expansion (`COPY $SRC /app/`, SRC unset) is an error: `""`
is the context's top, and the whole context (the Dockerfile, expected outputs) was copied.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from infra.tasks.harbor_words import arguments_of, shell_words

IGNORED_FLAGS = {"chown", "link"}
_FLAG = re.compile(r"--(?P<name>[^\s=]*)(?:=(?P<value>\S*))?(?:\s+|$)")
"""A flag at the start of COPY's arguments (Docker's `--name` or `--name=value`)."""
_OCTAL = re.compile(r"[0-7]{1,4}")
_REFUSED = {
    "from": "COPY --from (multi-stage) is not supported",
    "exclude": (
        "COPY --exclude is not supported: the files it keeps out would land in the workspace; "
        "COPY only the files the agent should get"
    ),
    "parents": (
        "COPY --parents is not supported: the sources' directories would not be kept; "
        "COPY each to its own destination"
    ),
}


def copy_words(arguments: str, env: dict[str, str], fail: Any) -> tuple[int | None, list[str], str]:
    """(the --chmod mode, None where none; the sources; the destination) of COPY `arguments`;
    `fail(why)` for a flag not taken, a heredoc, fewer than two words or an empty one."""
    mode: int | None = None
    while flag := _FLAG.match(arguments):
        name, value = flag.group("name"), flag.group("value")
        arguments = arguments[flag.end() :]
        if name in _REFUSED:
            raise fail(_REFUSED[name])
        if name == "chmod":
            mode = _mode(shell_words(value or "", env, fail, split=False), fail)
        elif name not in IGNORED_FLAGS:
            raise fail(
                f"COPY --{name} is not a flag this loader takes (only --chown and --link, "
                "ignored, and --chmod=OCTAL)"
            )
    words = arguments_of(arguments, env, fail)  # expanded as they are split
    if any(word.startswith("<<") for word in words):
        why = "put the file in the build context and COPY it"
        raise fail(f"COPY heredocs (<<EOF) are not supported: {why}")
    if len(words) < 2:
        raise fail("COPY needs a source and a destination")
    *sources, destination = words
    if "" in sources:
        raise fail(
            "COPY source is empty after expansion (an unset variable?): it would copy the "
            "whole build context"
        )
    if not destination:
        raise fail("COPY destination is empty after expansion (an unset variable?)")
    return mode, sources, destination


def _mode(words: list[str], fail: Any) -> int:
    """--chmod's mode: octal digits only (Docker's newer `u+x` is not read)."""
    if len(words) != 1 or not _OCTAL.fullmatch(words[0]):
        shown = words[0] if words else ""
        raise fail(f"COPY --chmod={shown!r}: only an octal mode (e.g. 755) is taken")
    return int(words[0], 8)


def matches(context: Path, source: str, fail: Any) -> list[Path]:
    """What COPY `source` names in the build `context`: the path, or a glob's matches (sorted).
    As Docker reads it, a leading `/` is the context's top."""
    relative = source.lstrip("/")
    if not any(c in relative for c in "*?["):
        found = [context / relative]
    else:
        try:
            found = sorted(context.glob(relative))
        except (ValueError, NotImplementedError, OSError) as exc:
            raise fail(f"COPY {source}: a pattern this loader cannot read ({exc})") from None
        if not found:
            raise fail(f"COPY {source}: no file in {context} matches")
    for match in found:
        try:
            inside = match.resolve().is_relative_to(context.resolve())
        except (OSError, RuntimeError) as exc:  # RuntimeError: a loop of links
            raise fail(f"COPY {source}: {exc}") from None
        if not inside:
            raise fail(f"COPY {source} lies outside the build context {context}")
        if not match.exists():
            raise fail(f"COPY {source}: no such file in {context}")
        if not match.is_dir() and not match.is_file():
            raise fail(f"COPY {source}: {match} is neither a file nor a directory")
    return found
