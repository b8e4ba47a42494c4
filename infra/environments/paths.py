"""Paths the agent names, resolved inside its workspace by the host, never outside it.

    relative = resolve(workspace_dir, "/app", "src/../lib.py")   # "lib.py" (src a directory)
    relative = resolve(workspace_dir, "/app", "/etc/passwd")     # PathError: outside

The agent names paths as its commands see them: relative to the workspace (its working
directory) or absolute under the workdir. The host (root) then opens them in the workspace
directory it holds, so a path must never lead out of it: `..` past the top, an absolute path
elsewhere, or a link (the agent's own, made with `ln -s`) whose target points out are all
refused. Links inside the workspace are followed the way the sandbox would follow them, one
component at a time, each checked with lstat below directories already known to be real, so no
lookup ever passes through a link; a `..` goes up from where the links before it led (with
`d -> sub/deep`, `d/../x` is `sub/x`, as `cat d/../x` reads; before, `..` was removed as text
first, and `d/../x` named the workspace's own `x`). Nothing runs in the workspace while the
host resolves (commands run one at a time, and a command's sandbox is gone when it returns).

What the host reads or writes there it does as the session's commands would (`as_user`): the
kernel checks the agent's own modes (a 0444 file, a 0555 directory, a 0000 file it may not
read) against the session's uid, not root's, and what is made belongs to that uid. Before,
root read and wrote past them. And it opens a resolved path one component at a time, following
no link (`beneath`): should one be put in after `resolve` looked (a process racing the tool),
the open fails as the agent's error instead of leading out of the workspace, as a root open of
the whole path would have (to a host file read, or a host directory open to all written).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import posixpath
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

MAX_LINKS = 40
"""Links followed while resolving one path (as the kernel's ELOOP limit)."""


AGENT_ERRNOS = frozenset(
    {errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.ELOOP, errno.EACCES, errno.ENXIO}
)
"""What a path an agent wrote can make a file operation fail with (a name longer than the file
system takes, a file or link where a directory must be, a mode of its own that denies the read
or write (only its own files are checked, `as_user`), a socket opened, ...): the agent's error,
told back to it as an observation. Any other OSError is the platform's, and its activity is
retried."""
DIRECTORY = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""How `beneath` opens each directory: for lookups below it only, never through a link."""
_LIBC = ctypes.CDLL(None, use_errno=True)


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
    """The components of `path` (relative to `workdir`, or absolute through it) below `workdir`,
    `.` dropped; its `..` are left to `resolve`, which takes each after the links before it."""
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not path.startswith("/"):
        return parts
    top = [part for part in posixpath.normpath(workdir).split("/") if part]
    if parts[: len(top)] != top:  # `/app/../app/x` too: out of the workspace on its way
        raise PathError(f"{path!r} is outside the workspace {workdir}")
    return parts[len(top) :]


def resolve(root: Path, workdir: str, path: str) -> str:
    """`path` as a link-free path relative to the workspace `root` (mounted at `workdir`).

    Components that do not exist yet are kept as they are (a file about to be written); a
    component that is a file with more components after it, a link out of the workspace, or one
    whose target goes up out of a missing directory (`gone/../d`, as the kernel) raises PathError."""
    if not path or "\0" in path:
        raise PathError("the path is empty or holds a NUL byte")
    pending = _inside(workdir, path)
    shown = path if len(path) <= 80 else path[:80] + "..."
    longest = os.pathconf(root, "PC_NAME_MAX")
    if any(len(name.encode()) > longest for name in pending):  # before a write makes parents
        raise PathError(f"{shown!r}: File name too long (a name over {longest} bytes)")
    if len(path.encode()) >= (limit := os.pathconf(root, "PC_PATH_MAX")):  # as the shell's open
        raise PathError(f"{shown!r}: File name too long (a path of {limit} bytes or more)")
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


@contextlib.contextmanager
def as_user(workspace: Path, uid: int | None) -> Iterator[int]:
    """A descriptor of `workspace` for `dir_fd` calls that the kernel checks as `uid` (and its
    gid, the same number, as the sandbox runs it) would make them, and whose files and
    directories it makes belong to it; `None`: as this process (not root: no other uid).

    Only this thread's filesystem ids change (setfsuid is per thread, unlike setuid), and only
    within the block; the descriptor is opened first, so the host's own directories above the
    workspace need not let `uid` through."""
    top = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        if uid is None:
            yield top
            return
        try:  # both inside: a refused setfsuid must not leave this thread the session's gid
            _set_fs_id(_LIBC.setfsgid, uid)  # while CAP_SETGID is effective (it stays so)
            _set_fs_id(_LIBC.setfsuid, uid)
            yield top
        finally:
            try:
                _set_fs_id(_LIBC.setfsuid, os.geteuid())  # first: restores the fs capabilities
            finally:
                _set_fs_id(_LIBC.setfsgid, os.getegid())
    finally:
        os.close(top)


@contextlib.contextmanager
def beneath(top: int, directory: str, make: bool = False) -> Iterator[int]:
    """A descriptor of `directory` (relative to the descriptor `top`, link-free as `resolve`
    returns it), opened one component at a time without following a link: a link (or file)
    found where a directory was fails with ENOTDIR, the agent's error. `make`: missing
    directories are made (0755), as the user `top` acts as (`as_user`)."""
    fd = top
    try:
        for name in directory.split("/") if directory else []:
            if make:
                with contextlib.suppress(
                    FileExistsError
                ):  # the kernel says so before any mode check
                    os.mkdir(name, 0o755, dir_fd=fd)
            below = os.open(name, DIRECTORY, dir_fd=fd)
            if fd != top:
                os.close(fd)
            fd = below
        yield fd
    finally:
        if fd != top:
            os.close(fd)


def _set_fs_id(call: Callable[[int], int], value: int) -> None:
    """`call(value)`, checked: setfsuid and setfsgid return the previous id, success or not."""
    call(value)
    if call(value) != value:
        raise OSError(errno.EPERM, f"{call.__name__}({value}) failed")
