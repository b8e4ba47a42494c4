"""The `read_file` and `write_file` tools of a workspace session, done by the host.

    seen = read_file(session, "src/app.py", limits)            # its text, or an error observation
    seen = write_file(session, "/app/notes.txt", "text\n", limits)

Each takes a path the agent names, relative to the workspace or absolute under the task's
workdir. Links are followed only within the workspace (`paths.resolve`), the resolved path is
opened without following any (`paths.beneath`), and both act as the session's uid, its modes
checked as its commands' are (`paths.as_user`): what the agent's shell may not read,
`read_file` may not either. What is not a regular file (a directory, a FIFO, a socket) is an
error observation, never opened: a FIFO's open would wait. `read_file` returns at most
`output_bytes` of UTF-8 text (a cut is said), `write_file` at most `file_size_mb`.

`write_file` rewrites a file in place, as the shell's `>` does (its inode, mode, owner and hard
links kept; a writable file in a 0555 directory written), but first allocates the room its new
content takes (`posix_fallocate`): on a full workspace it fails before a byte changes. Before,
it truncated the file, then failed midway with ENOSPC, and the half-written file was stored.

A path out of the workspace raises `paths.PathError`, and a failed system call OSError: the
caller (`workspace.py`'s step) makes the agent's of them an error observation.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import posixpath
import stat

from contracts.task import SandboxLimits
from infra.environments.base import Observation
from infra.environments.paths import as_user, beneath, resolve
from infra.environments.sessions import Session

READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
WRITE = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
"""How the file tools open the last component of a path (below `paths.beneath`'s directory):
never through a link, never waiting (a FIFO swapped in since its stat). `write_file` adds
O_CREAT | O_EXCL for a file it makes (removed again if its write fails)."""


def read_file(session: Session, path: str, limits: SandboxLimits) -> Observation:
    """The text of the file at `path` (cut at `output_bytes`), or an error observation."""
    directory, name = posixpath.split(resolve(session.workspace, session.spec.workdir, path))
    uid = session.uid if os.geteuid() == 0 else None
    try:
        with as_user(session.workspace, uid) as top, beneath(top, directory) as parent:
            kind = os.stat(name or ".", dir_fd=parent, follow_symlinks=False).st_mode
            if not stat.S_ISREG(kind):  # a socket's open fails (ENXIO), a FIFO's would wait
                return _not_a_file(path, kind)
            fd = os.open(name, READ, dir_fd=parent)
    except FileNotFoundError:
        return Observation(f"error: {path}: no such file")
    if not stat.S_ISREG(kind := os.fstat(fd).st_mode):  # swapped in since the stat
        os.close(fd)
        return _not_a_file(path, kind)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(limits.output_bytes + 1)
    cut = len(data) > limits.output_bytes
    try:  # a character the cut splits is left out, not taken for a binary file
        text = codecs.getincrementaldecoder("utf-8")().decode(
            data[: limits.output_bytes], final=not cut
        )
    except UnicodeDecodeError:
        return Observation(f"error: {path} is not a UTF-8 text file")
    if cut:
        text += f"\n(cut at {limits.output_bytes} bytes)"
    return Observation(text)


def write_file(session: Session, path: str, content: str, limits: SandboxLimits) -> Observation:
    """Make the file at `path` hold `content` (its directories made as needed)."""
    data = content.encode()
    if len(data) > limits.file_size_mb << 20:
        return Observation(f"error: the content is larger than {limits.file_size_mb} MB")
    relative = resolve(session.workspace, session.spec.workdir, path)
    if not relative:
        return Observation(f"error: {path} is the workspace itself")
    directory, name = posixpath.split(relative)
    uid = session.uid if os.geteuid() == 0 else None
    with as_user(session.workspace, uid) as top, beneath(top, directory, make=True) as parent:
        with contextlib.suppress(FileNotFoundError):  # a file to make
            kind = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
            if not stat.S_ISREG(kind):  # a FIFO's open would fail (ENXIO), or wait for a reader
                return _not_a_file(path, kind)
        _rewrite(parent, name, data)
    return Observation(f"wrote {len(data)} bytes to {relative}")


def _rewrite(parent: int, name: str, data: bytes) -> None:
    """Make the file `name` (under the open directory `parent`, made 0644 if missing) hold
    `data`, all of whose room is allocated first: an OSError (ENOSPC) leaves it as it was, or
    not there."""
    try:
        fd, made = os.open(name, WRITE | os.O_CREAT | os.O_EXCL, 0o644, dir_fd=parent), True
    except FileExistsError:
        fd, made = os.open(name, WRITE, dir_fd=parent), False
    try:
        if data:  # an error past here: the file unchanged (tmpfs undoes a failed allocation)
            os.posix_fallocate(fd, 0, len(data))
        with os.fdopen(os.dup(fd), "wb") as handle:
            handle.write(data)  # into pages already allocated
        os.ftruncate(fd, len(data))
    except BaseException:
        if made:
            os.unlink(name, dir_fd=parent)
        raise
    finally:
        os.close(fd)


def _not_a_file(path: str, mode: int) -> Observation:
    return Observation(f"error: {path} is {'a directory' if stat.S_ISDIR(mode) else 'not a file'}")
