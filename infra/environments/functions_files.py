"""The workspace files a `functions` check copies into its candidate's /tmp/workspace.

    copied = program_files(workspace, contents)     # ProgramFiles, or why not (a str)
    program = functions_program(copied.files, check.modules)           # checks.py
    ... copied.left_out                             # what was not copied, for the verdict

What Python in the workspace saw, within a budget (`MAX_PROGRAM_BYTES`, `program_cost`):

- a link inside the tree stands for what it names (`linked_files`): a file's content, or a
  directory's files, under the link's path (`calc.py -> src/calc_impl.py`, `pkg -> src/pkg`),
  its chain followed as the kernel follows it (relative to the link's directory, at most
  `MAX_LINK_HOPS` links); a link that leaves the tree (an absolute target, `..` past the root),
  loops, or names nothing is not followed, and named;
- nothing under a VCS or cache directory (`SKIPPED_DIRS`: a repository's .git/objects sorted
  first and filled the budget, and the data a correct module read at import was dropped);
- every Python file (the modules under test and whatever they import): past the budget, the
  check cannot run (the agent's doing, scored 0 by the caller);
- then, smallest first while they fit, the Python files links stand for (a module that is a
  link; a link to the workspace's own directory doubles its Python, which is never a reason
  not to check it), then the other files of up to `MAX_PROGRAM_FILE`.

Whatever is not copied is named (`ProgramFiles.left_out`: counts and the first paths), so a
verdict of 0 that comes from it says so.

Not covered: a link to an absolute path inside the workspace (`/app/src/x.py` in a workspace
at /app) is taken as leaving the tree: the tree does not know its workdir.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping
from dataclasses import dataclass

from infra.environments.tree import Entry, Manifest

MAX_PROGRAM_FILE = 1 << 20
"""Workspace files other than Python larger than this are not copied into the functions check."""
MAX_PROGRAM_BYTES = 8 << 20
"""Workspace bytes a functions check copies in all, each file's name counted as the program's
JSON writes it (`program_cost`). Its program travels in one frame of the verifier's codec
(16 MiB), and base64, JSON and base64 again grow the bytes by at most 1.4× (zlib gives back
most of the first base64): every file up to 1 MiB of a 13 MB workspace made a program no frame
could carry, a TypeError on every retry of the verify, and so did 68,000 empty files with names
of 255 bytes while names were not counted."""
MAX_LINK_HOPS = 40
"""Links followed to resolve one path (Linux's MAXSYMLINKS): past it, a loop."""
MAX_LINK_WORK = 1 << 17
"""Links resolved and entries their directories list, in all (each directory link lists its
target's): past it, or past `MAX_PROGRAM_BYTES` of files listed (more than a check copies),
the links left are not followed (links to large directories, or to each other's, would list
for seconds, or without end)."""
SKIPPED_DIRS = frozenset(
    {".git", ".hg", ".svn", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache", "node_modules"}
)
"""Directories never copied: a repository's history, caches, installed environments (none is a
module the check imports; their files could fill the budget before the data a module reads)."""
NAMED = 8
"""Paths a note names of each kind left out."""


@dataclass(frozen=True)
class ProgramFiles:
    files: dict[str, bytes]
    """Path (in the workspace, a link's own) → content."""
    left_out: str = ""
    """What of the workspace was not copied and why ("" if nothing)."""


def program_cost(entry: Entry) -> int:
    """What a file adds to a functions check's program before base64 and zlib: its bytes, and
    its name with the JSON around it (escapes included: a control character takes six)."""
    return entry.size + len(json.dumps({entry.path: ""}))


def program_files(workspace: Manifest, contents: Mapping[str, bytes]) -> ProgramFiles | str:
    """The files a functions check copies (the module's rules), or why it cannot: the Python
    files of the tree (not its links) are larger than `MAX_PROGRAM_BYTES`, the agent's doing."""
    linked, links = linked_files(workspace)
    own, through = _kept(workspace.files()), _kept(linked)
    cached = len(workspace.files()) + len(linked) - len(own) - len(through)
    python = [entry for entry in own if entry.path.endswith(".py")]
    if (size := sum(map(program_cost, python))) > MAX_PROGRAM_BYTES:
        largest = sorted(python, key=lambda entry: -program_cost(entry))[:3]
        named = ", ".join(f"{e.path[:100]} {program_cost(e) / 1e6:.1f} MB" for e in largest)
        return (
            f"the workspace's Python files hold {size / 1e6:.1f} MB, more than the "
            f"{MAX_PROGRAM_BYTES >> 20} MiB a functions check copies (names counted; the "
            f"largest: {named})"
        )
    files = {entry.path: contents[entry.sha256] for entry in python}
    large, late = [], []
    order = sorted(  # a link's Python (a module as a link), then data; smallest first
        (entry for entry in [*own, *through] if entry.path not in files),
        key=lambda entry: (not entry.path.endswith(".py"), program_cost(entry), entry.path),
    )
    for entry in order:
        if entry.size > MAX_PROGRAM_FILE and not entry.path.endswith(".py"):
            large.append(entry.path)
        elif size + (cost := program_cost(entry)) <= MAX_PROGRAM_BYTES:
            files[entry.path], size = contents[entry.sha256], size + cost
        else:
            late.append(entry.path)
    notes = [
        *([f"{_count(cached)} in VCS and cache directories ({', '.join(sorted(SKIPPED_DIRS))})"]
          if cached else []),
        *([f"{_count(len(late))} past the {MAX_PROGRAM_BYTES >> 20} MiB a functions check "
           f"copies: {_first(sorted(late))}"] if late else []),
        *([f"{_count(len(large))} larger than the {MAX_PROGRAM_FILE >> 20} MiB it copies of "
           f"a file: {_first(sorted(large))}"] if large else []),
        *([f"links not followed: {_first(links)}"] if links else []),
    ]  # fmt: skip
    return ProgramFiles(files, "; ".join(notes))


def linked_files(workspace: Manifest) -> tuple[list[Entry], list[str]]:
    """The files the tree's links stand for, each under its path through its link (a directory
    link: its target's files, and their links followed in turn), and each link not followed,
    with why ("a -> /etc/x (leaves the tree)"). Links in `SKIPPED_DIRS` are not followed."""
    by_path = {entry.path: entry for entry in workspace.entries}
    paths = [entry.path for entry in workspace.entries]  # in path order (`Manifest`)
    pending: list[tuple[str, str, tuple[str, ...]]] = [
        (entry.path, entry.path, ())
        for entry in reversed(workspace.entries)
        if entry.kind == "link"
    ]
    found: list[Entry] = []
    skipped: list[str] = []
    work = listed = 0
    while pending:
        path, shown, within = pending.pop()  # the link's path, its path as seen, dirs listed
        if _skipped(shown.split("/")):
            continue
        work += 1
        if work > MAX_LINK_WORK or listed > MAX_PROGRAM_BYTES:
            skipped.append(f"{shown[:100]} and {len(pending)} more (past what a check copies)")
            break
        resolved, why = resolve(path, by_path)
        looped = not why and any(_inside(done, resolved) for done in within)
        if looped or (why and not within):  # one met below a directory link: named at its own
            why = why or "a directory holding itself"
            skipped.append(f"{shown[:100]} -> {by_path[path].target[:100]} ({why})")
        if why:
            continue
        target = by_path.get(resolved)
        if target is not None and target.kind == "file":
            found.append(target.model_copy(update={"path": shown}))
            listed += program_cost(found[-1])
            continue
        start = f"{resolved}/" if resolved else ""
        first = last = bisect.bisect_left(paths, start)  # a directory's entries: one run
        while last < len(paths) and paths[last].startswith(start):
            last += 1
        work += last - first
        for entry in workspace.entries[first:last][::-1]:
            below = f"{shown}/{entry.path[len(start) :]}"
            if entry.kind == "file":
                found.append(entry.model_copy(update={"path": below}))
                listed += program_cost(found[-1])
            elif entry.kind == "link":
                pending.append((entry.path, below, (*within, resolved)))
    return found, skipped


def resolve(path: str, by_path: Mapping[str, Entry]) -> tuple[str, str]:
    """The path inside the tree (its root: "") that `path` names, its links followed as the
    kernel follows them, and "", or "" and why it names nothing there: it leaves the tree (an
    absolute target, `..` past the root), loops (`MAX_LINK_HOPS`), or names no entry."""
    parts, done, hops = path.split("/")[::-1], list[str](), 0
    while parts:
        part = parts.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not done:
                return "", "leaves the tree"
            done.pop()
            continue
        entry = by_path.get("/".join([*done, part]))
        if entry is None or (entry.kind == "file" and parts):  # `file/…`: ENOTDIR
            return "", "names nothing in the tree"
        if entry.kind != "link":
            done.append(part)
            continue
        hops += 1
        if hops > MAX_LINK_HOPS:
            return "", f"a loop, or a chain of more than {MAX_LINK_HOPS} links"
        if entry.target.startswith("/"):
            return "", "leaves the tree"
        parts.extend(entry.target.split("/")[::-1])
    return "/".join(done), ""


def _inside(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or lies below it ("" is the root)."""
    return not directory or path == directory or path.startswith(f"{directory}/")


def _kept(files: list[Entry]) -> list[Entry]:
    """`files` less those in `SKIPPED_DIRS`."""
    return [entry for entry in files if not _skipped(entry.path.split("/")[:-1])]


def _skipped(parts: list[str]) -> bool:
    return not SKIPPED_DIRS.isdisjoint(parts)


def _count(number: int) -> str:
    return f"{number} file{'' if number == 1 else 's'}"


def _first(names: list[str]) -> str:
    shown = ", ".join(name[:100] for name in names[:NAMED])
    return shown + (f" and {len(names) - NAMED} more" if len(names) > NAMED else "")
