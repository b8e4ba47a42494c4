"""One path of a workspace tree (`Entry`), and the mode bits a tree keeps of it.

    mode, executable = entry_mode("file", info.st_mode)     # a snapshot's scan (snapshot_scan.py)
    entry = Entry(path="run.sh", kind="file", sha256=digest, executable=executable, mode=mode)
    os.fchmod(fd, entry.permissions())                     # a restore (disk.py)

Modes: a file or directory keeps its permission bits and the sticky bit (`KEPT_MODE`), stored
only where they differ from what a tree without modes restores (`default_mode`: files 0644, or
0755 if any executable bit is set; directories 0755), so such trees keep their digests. Setuid
and setgid are never kept: a restore as root (the hidden tests', a solution's) would hand out
what they grant; a session's scan clears them in the live workspace too (`walk.py`). A hard
link is an entry for each of its paths: the first in path order holds the file, each other
names it (`Entry.target`), and a restore links them again.

Not covered: the tree the entries make up, its rules across entries (path order, nothing below
a link or a file, hard links naming an earlier file of theirs) and its digest (`tree.py`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

KEPT_MODE = 0o1777
"""The mode bits a tree keeps: permissions and the sticky bit, never setuid or setgid."""


class Entry(BaseModel):
    """One path of a tree."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str
    kind: Literal["file", "dir", "link"]
    sha256: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")
    """A file's content digest."""
    size: int = Field(default=0, ge=0)
    executable: bool = False
    target: str = ""
    """A link's target, as written (never followed when the tree is stored or restored); a
    file's, if it is a hard link: the earlier path of the tree holding the same file."""
    mode: int | None = Field(default=None, ge=0, le=KEPT_MODE)
    """A file's or directory's mode bits (`KEPT_MODE`: no larger number has other bits), where
    they differ from `default_mode` (None: that one)."""

    def permissions(self) -> int:
        """The mode bits a restore gives it."""
        return default_mode(self.kind, self.executable) if self.mode is None else self.mode


def default_mode(kind: str, executable: bool) -> int:
    """The mode of a file or directory that a tree stores without one (as before modes were
    kept: their digests are unchanged)."""
    return 0o755 if kind == "dir" or executable else 0o644


def entry_mode(kind: str, st_mode: int) -> tuple[int | None, bool]:
    """`Entry.mode` and `Entry.executable` of a file or directory of mode `st_mode`."""
    bits, executable = st_mode & KEPT_MODE, kind == "file" and bool(st_mode & 0o111)
    return (None if bits == default_mode(kind, executable) else bits), executable
