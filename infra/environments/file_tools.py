"""The `read_file` and `write_file` tools of a workspace session, done by the host.

    seen = read_file(session, "src/app.py", limits)            # its text, or an error observation
    seen = write_file(session, "/app/notes.txt", "text\n", limits)

Each takes a path the agent names, relative to the workspace or absolute under the task's
workdir. Links are followed only within the workspace (`paths.resolve`), the resolved path is
opened without following any (`paths.beneath`), and both act as the session's uid, its modes
checked as its commands' are (`paths.as_user`): what the agent's shell may not read,
`read_file` may not either. What is not a regular file (a directory, a FIFO, a socket) is an
error observation, never opened: a FIFO's open would wait. `read_file` returns at most
`output_bytes` of UTF-8 text, `write_file` writes at most `file_size_mb`.

`read_file` reads lines `start_line`..`end_line` (1-based, inclusive; by default all), cut at
`output_bytes` on a line's end (a line longer than that inside it), the cut said with the lines
not shown and how to read them. A range, or a text the observation's clip may cut
(`contracts.episode.CLIPPED_FROM_BYTES`), starts with the lines it holds and how many the file has
(`contracts.episode.lines_header`): the clip then cuts whole lines and names those it leaves out
(before, the middle of a file over ~4 KB was beyond `read_file`'s reach, and a model that wrote
back what it read deleted it). A short file read whole is its text alone.

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
from dataclasses import dataclass
from typing import BinaryIO

from contracts.episode import CLIPPED_FROM_BYTES, lines_header, read_lines_hint
from contracts.task import SandboxLimits
from infra.environments.base import Observation
from infra.environments.paths import as_user, beneath, resolve
from infra.environments.sessions import Session

READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
WRITE = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
"""How the file tools open the last component of a path (below `paths.beneath`'s directory):
never through a link, never waiting (a FIFO swapped in since its stat). `write_file` adds
O_CREAT | O_EXCL for a file it makes (removed again if its write fails)."""


CHUNK = 1 << 20
"""How much of a file `read_file` reads at a time (it counts the lines of all of it)."""


def read_file(
    session: Session,
    path: str,
    limits: SandboxLimits,
    start_line: int | None = None,
    end_line: int | None = None,
) -> Observation:
    """Lines `start_line`..`end_line` of the file at `path` (all by default; cut at
    `output_bytes`), or an error observation."""
    for name, value in (("start_line", start_line), ("end_line", end_line)):
        if value is not None and (type(value) is not int or value < 1):
            return Observation(f"error: {name} must be a whole number from 1")
    first = start_line or 1
    if end_line is not None and end_line < first:
        return Observation(f"error: end_line {end_line} is before start_line {first}")
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
        part = _lines(handle, first, end_line, limits.output_bytes)
    if first > max(part.total, 1):
        return Observation(
            f"error: {path} has {part.total} lines: start_line {first} is past its end"
        )
    try:  # a character the cut splits is left out, not taken for a binary file
        text = codecs.getincrementaldecoder("utf-8")().decode(part.data, final=not part.inside)
    except UnicodeDecodeError:
        return Observation(f"error: {path} is not a UTF-8 text file")
    if part.total and (start_line or end_line or len(part.data) > CLIPPED_FROM_BYTES):
        text = lines_header(path, first, part.shown, part.total) + text
    if part.cut:
        text += ("" if text.endswith("\n") else "\n") + _cut_note(path, part, end_line, limits)
    return Observation(text)


@dataclass(frozen=True)
class _Part:
    """What `_lines` read of a file."""

    data: bytes
    shown: int
    """The last line `data` holds (whole unless `inside`)."""
    total: int
    cut: bool
    """`data` was cut at the byte budget (lines asked for not shown, or `inside`)."""
    inside: bool
    """The cut fell inside line `shown`, longer than the budget."""


def _lines(handle: BinaryIO, first: int, last: int | None, budget: int) -> _Part:
    """Lines `first`..`last` (to the end when None) of the file `handle` reads, at most `budget`
    bytes of them: whole lines, or the first `budget` bytes of line `first` when it alone is
    longer; and how many lines the file has (all of it read, in chunks)."""
    kept = bytearray()
    line, shown, line_at = 1, first - 1, 0  # the line at `at`; the last kept; where it starts
    collecting, cut, inside = True, False, False
    newlines = size = 0
    ends_line = True  # the file's last byte is a newline (or it has none)
    while chunk := handle.read(CHUNK):
        newlines += chunk.count(b"\n")
        size += len(chunk)
        ends_line = chunk.endswith(b"\n")
        at = 0
        while collecting and at < len(chunk):
            if line < first:  # skip to line `first`: whole chunks, then line by line
                if line + (skipped := chunk.count(b"\n", at)) < first:
                    line += skipped
                    break
                while line < first:  # the chunk holds it: step newline by newline (counted once)
                    line, at = line + 1, chunk.index(b"\n", at) + 1
                continue
            if last is not None and line > last:
                collecting = False
                break
            newline = chunk.find(b"\n", at)
            end = len(chunk) if newline < 0 else newline + 1
            kept += chunk[at:end]
            at = end
            if len(kept) > budget:
                collecting, cut, inside = False, True, line_at == 0
                del kept[line_at or budget :]
                shown = line if inside else shown
            elif newline >= 0:
                shown, line, line_at = line, line + 1, len(kept)
    total = newlines + (0 if ends_line else 1)  # 0 for an empty file
    if collecting and line_at < len(kept):  # the last line, with no newline at its end
        shown = line
    return _Part(bytes(kept), min(shown, total), total, cut, inside)


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


def _cut_note(path: str, part: _Part, end_line: int | None, limits: SandboxLimits) -> str:
    """`read_file`'s note of a cut at `output_bytes`: the lines asked for that it did not show
    (the rest of a line cut inside is beyond reading by lines), and how to read them."""
    wanted, after = min(end_line or part.total, part.total), part.shown + 1
    if after > wanted:
        return f"(cut at {limits.output_bytes} bytes)"
    hint = read_lines_hint(path, after, wanted)
    return f"(cut at {limits.output_bytes} bytes: lines {after}-{wanted} not shown; {hint})"


def _not_a_file(path: str, mode: int) -> Observation:
    return Observation(f"error: {path} is {'a directory' if stat.S_ISDIR(mode) else 'not a file'}")
