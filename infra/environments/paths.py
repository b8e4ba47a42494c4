"""Paths the agent names, resolved inside its workspace by the host, never outside it.

    relative = resolve(workspace_dir, "/app", "src/../lib.py")   # "lib.py"
    relative = resolve(workspace_dir, "/app", "/etc/passwd")     # PathError: outside

The agent names paths as its commands see them: relative to the workspace (its working
directory) or absolute under the workdir. The host (root) then opens them in the workspace
directory it holds, so a path must never lead out of it: `..` past the top, an absolute path
elsewhere, or a link (the agent's own, made with `ln -s`) whose target points out are all
refused. Links inside the workspace are followed the way the sandbox would follow them, one
component at a time, each checked with lstat below directories already known to be real, so no
lookup ever passes through a link. Nothing runs in the workspace while the host resolves
(commands run one at a time, and a command's sandbox is gone when it returns).
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from pathlib import Path

MAX_LINKS = 40
"""Links followed while resolving one path (as the kernel's ELOOP limit)."""


AGENT_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.ELOOP})
"""What a path an agent wrote can make a file operation fail with (a name longer than the file
system takes, a file where a directory must be, ...): the agent's error, told back to it as an
observation. Any other OSError is the platform's, and its activity is retried."""


def is_utf8(text: str) -> bool:
    """Whether `text` encodes as UTF-8: a name read from the file system (or JSON's lone
    "\\ud83d") may hold surrogates, which no manifest, payload, file or command can carry."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


class PathError(ValueError):
    """A path the agent may not use; the message is written for the agent."""


def _inside(workdir: str, path: str) -> list[str]:
    """The components of `path` (relative to `workdir`, or absolute) below `workdir`."""
    joined = posixpath.normpath(posixpath.join(workdir, path))
    if joined != workdir and not joined.startswith(workdir.rstrip("/") + "/"):
        raise PathError(f"{path!r} is outside the workspace {workdir}")
    relative = posixpath.relpath(joined, workdir)
    return [] if relative == "." else relative.split("/")


def resolve(root: Path, workdir: str, path: str) -> str:
    """`path` as a link-free path relative to the workspace `root` (mounted at `workdir`).

    Components that do not exist yet are kept as they are (a file about to be written); a
    component that is a file with more components after it, a link out of the workspace, or one
    whose target goes up out of a missing directory (`gone/../d`, as the kernel) raises PathError."""
    if not path or "\0" in path:
        raise PathError("the path is empty or holds a NUL byte")
    pending = _inside(workdir, path)
    longest = os.pathconf(root, "PC_NAME_MAX")
    if any(len(name.encode()) > longest for name in pending):  # before a write makes parents
        shown = path if len(path) <= 80 else path[:80] + "..."
        raise PathError(f"{shown!r}: File name too long (a name over {longest} bytes)")
    done: list[str] = []
    links = 0
    while pending:
        name = pending.pop(0)
        if name == "..":
            if not done:
                raise PathError(f"{path!r} leads outside the workspace {workdir}")
            done.pop()
            continue
        try:
            info = os.lstat(root.joinpath(*done, name))
        except FileNotFoundError:
            if ".." in pending:  # as the kernel: no way up out of a directory that is not there
                raise PathError(
                    f"{path!r}: no such directory {'/'.join(done + [name])!r}"
                ) from None
            return "/".join(done + [name] + pending)
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > MAX_LINKS:
                raise PathError(f"{path!r}: too many levels of links")
            target = os.readlink(root.joinpath(*done, name))
            if target.startswith("/"):
                pending, done = _inside(workdir, target) + pending, []
            else:
                pending = [part for part in target.split("/") if part not in ("", ".")] + pending
            continue
        if pending and not stat.S_ISDIR(info.st_mode):
            raise PathError(f"{path!r}: {'/'.join(done + [name])} is not a directory")
        done.append(name)
    return "/".join(done)
