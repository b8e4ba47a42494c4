"""The workspace files a `functions` check copies into its candidate's /tmp/workspace.

    copied = program_files(workspace, contents)     # ProgramFiles, or why not (a str)
    program = functions_program(copied.files, check.modules)           # checks.py
    ... copied.left_out                             # what was not copied, for the verdict

What Python in the workspace saw, within a budget (`MAX_PROGRAM_BYTES`, `program_cost`):

- a link inside the tree stands for what it names (`linked_files`): a file's content, or a
  directory's files, under the link's path (`calc.py -> src/calc_impl.py`, `pkg -> src/pkg`),
  its chain followed as the kernel follows it (relative to the link's directory, at most
  `MAX_LINK_HOPS` links); a link that leaves the tree (an absolute target, `..` past the root),
  loops, or names nothing is not followed, and named; so are the links left once following them
  has taken `MAX_LINK_WORK` (every part walked, hop and entry listed: each link resolved once);
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
from collections import deque
from collections.abc import Generator, Mapping
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
MAX_LINK_WORK = 1 << 20
"""Work following the links may take, in all: each path part a link's target walks, each hop,
each link taken (its path's parts), each entry a directory link lists (`LISTED`), and each
`PATH_UNIT` of the paths these copy. Past it, or past `MAX_PROGRAM_BYTES` of files listed (more
than a check copies), the links left are not followed. Each link is resolved once. Well under a
second on one core, whatever the tree: before, one unit a link (not its hops nor the parts its
target walks) let targets padded with `./` (2,000 parts in 4 KB), chained 40 deep, take ~12
minutes at the tree cap, on the sandbox worker's event loop."""
LISTED = 8
"""Work units an entry a directory link lists costs (it is copied and priced: `program_cost`)."""
PATH_UNIT = 4096
"""Bytes of a path copied or split that cost one unit of work beside its parts."""
LEAVES, NOTHING = "leaves the tree", "names nothing in the tree"
LOOP = f"a loop, or a chain of more than {MAX_LINK_HOPS} links"
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
    entries = workspace.files()
    own, through = _kept(entries), _kept(linked)
    cached = len(entries) + len(linked) - len(own) - len(through)
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
    links = _Links(workspace)
    paths = [entry.path for entry in workspace.entries]  # in path order (`Manifest`)
    pending: list[tuple[str, str, tuple[str, ...]]] = [
        (entry.path, entry.path, ())
        for entry in reversed(workspace.entries)
        if entry.kind == "link"
    ]
    found: list[Entry] = []
    skipped: list[str] = []
    listed = 0
    while pending:
        path, shown, within = pending.pop()  # the link's path, its path as seen, dirs listed
        try:  # its path's parts (and its bytes), the directories it is checked against
            links.charge(1 + shown.count("/") + len(shown) // PATH_UNIT + len(within))
            if _skipped(shown.split("/")):
                continue
            if listed > MAX_PROGRAM_BYTES:
                raise _Spent
            resolved, why = links.resolve(path)
            looped = not why and any(_inside(done, resolved) for done in within)
            if looped or (why and not within):  # one met below a directory link: named at its own
                why = why or "a directory holding itself"
                skipped.append(f"{shown[:100]} -> {links.by_path[path].target[:100]} ({why})")
            if why:
                continue
            target = links.by_path.get(resolved)
            if target is not None and target.kind == "file":
                found.append(target.model_copy(update={"path": shown}))
                listed += program_cost(found[-1])
                continue
            start = f"{resolved}/" if resolved else ""  # a directory's entries: one run
            first = bisect.bisect_left(paths, start)
            last = bisect.bisect_left(paths, f"{resolved}0") if resolved else len(paths)  # "/"+1
            links.charge((last - first) * (LISTED + len(shown) // PATH_UNIT))
        except _Spent:
            skipped.append(f"{shown[:100]} and {len(pending)} more (past what a check copies)")
            break
        for entry in workspace.entries[first:last][::-1]:
            below = f"{shown}/{entry.path[len(start) :]}"
            if entry.kind == "file":
                found.append(entry.model_copy(update={"path": below}))
                listed += program_cost(found[-1])
            elif entry.kind == "link":
                pending.append((entry.path, below, (*within, resolved)))
    return found, skipped


class _Spent(Exception):
    """`MAX_LINK_WORK` is spent: the links left are not followed."""


Resolved = tuple[str, str, int]
"""What a link names in the tree ("" if nothing), why it names nothing (""), and the links its
resolution followed (itself included): what resolving the link alone gives, whatever path it is
met in (its target is read relative to its own directory)."""
LOOPED: Resolved = ("", LOOP, MAX_LINK_HOPS + 1)


class _Links:
    """The tree's links resolved as the kernel resolves them, each once (`resolved`), every
    path part walked, hop and listed entry counted against `MAX_LINK_WORK` (`charge`)."""

    def __init__(self, workspace: Manifest) -> None:
        self.by_path = {entry.path: entry for entry in workspace.entries}
        self.resolved: dict[str, Resolved] = {}
        self.reached = {""}  # directories a walk from the root reaches (their parents listed)
        self.work = 0

    def charge(self, units: int) -> None:
        """Count `units` of work; `_Spent` past `MAX_LINK_WORK`."""
        self.work += units
        if self.work > MAX_LINK_WORK:
            raise _Spent

    def resolve(self, link: str) -> tuple[str, str]:
        """The path inside the tree (its root: "") that the link `link` names, its chain followed
        as the kernel follows it, and "", or "" and why it names nothing there: it leaves the
        tree (an absolute target, `..` past the root), loops (`MAX_LINK_HOPS`), or names no
        entry. `_Spent` once the budget is."""
        resolved, why, _ = self._resolve(link)
        return resolved, why

    def _resolve(self, link: str) -> Resolved:
        """`_walk` of `link`, and of each link it meets that is not yet resolved, without
        recursion: a link met again before its own walk ended needs itself, a loop; a walk with
        more than `MAX_LINK_HOPS` walks waiting above it is one too (each adds a hop to the one
        below it), resolved so and dropped (a chain of 100,000 links keeps 41 walks, not all)."""
        if (known := self.resolved.get(link)) is not None:
            return known
        walks, walking = deque([(link, self._walk(link))]), {link}
        answer: Resolved | None = None
        while walks:
            name, walk = walks[-1]
            try:
                needed = walk.send(answer) if answer else next(walk)
            except StopIteration as end:
                self.resolved[name] = answer = end.value
                walking.discard(name)
                walks.pop()
                continue
            self.charge(1)  # a hop
            if (answer := self.resolved.get(needed)) is None:
                if needed in walking:
                    answer = LOOPED
                else:
                    walks.append((needed, self._walk(needed)))
                    walking.add(needed)
                    if len(walks) > MAX_LINK_HOPS + 1:  # the first: more than 40 hops
                        looped, _ = walks.popleft()
                        self.resolved[looped] = LOOPED
                        walking.discard(looped)
        return self.resolved[link]

    def _walk(self, link: str) -> Generator[str, Resolved, Resolved]:
        """What `link` names: its target's parts walked from its directory; each link met is
        yielded, and what it names sent back."""
        directory, target = link.rpartition("/")[0], self.by_path[link].target
        self.charge(target.count("/") + 1 + len(target) // PATH_UNIT)
        if not self._reaches(directory):
            return "", NOTHING, 1
        if target.startswith("/"):
            return "", LEAVES, 1
        parts, here, hops = target.split("/")[::-1], directory, 1
        while parts:
            part = parts.pop()
            if part in ("", "."):
                continue
            if part == "..":
                if not here:
                    return "", LEAVES, hops
                here = here.rpartition("/")[0]
                continue
            entry = self.by_path.get(f"{here}/{part}" if here else part)
            if entry is None or (entry.kind == "file" and parts):  # `file/…`: ENOTDIR
                return "", NOTHING, hops
            if entry.kind != "link":
                here = entry.path
                continue
            resolved, why, more = yield entry.path
            hops += more
            if hops > MAX_LINK_HOPS:
                return "", LOOP, hops
            if why:
                return "", why, hops
            named = self.by_path.get(resolved)
            if named is not None and named.kind == "file" and parts:
                return "", NOTHING, hops
            here = resolved
        return here, "", hops

    def _reaches(self, directory: str) -> bool:
        """Whether a walk from the root reaches `directory` (it and those above it listed)."""
        above = []
        while directory not in self.reached:
            if directory not in self.by_path:
                return False
            above.append(directory)
            directory = directory.rpartition("/")[0]
        self.charge(len(above))
        self.reached.update(above)
        return True


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
