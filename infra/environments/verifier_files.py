"""Files a verifier reads that others wrote: a Harbor task's, and the reward its test script left.

    data = read_regular(path, max_bytes)    # a regular file's bytes, or OSError / FileTooLarge
    reward = left_reward(logs, "tests/test.sh")    # None: no reward file; RewardError: why not
    forged = verifier_links(workspace, "/app")     # ["primes.txt -> /tests/expected.txt"]

`read_regular` is how such files are read (the Harbor loader's task files, a script's reward):
never a FIFO's wait, never a link followed unless asked, never more bytes than asked for.

The reward is Harbor's (its verifier, src/harbor/verifier/verifier.py: `reward_text_path`
first, else `reward_json_path`): /logs/verifier/reward.txt when the script wrote one, else
/logs/verifier/reward.json (`REWARD_FILES`, in that order: reward.json is not read when
reward.txt exists). reward.txt holds one number; reward.json a JSON object of named rewards
(Harbor's rewardkit writes `{"reward": 0.75}`). Where it names `reward`, that is the score,
whatever else it holds: a number, or a boolean as 1 or 0 (Harbor's `VerifierResult.rewards`,
a pydantic `dict[str, float | int]`, takes `false` as 0); anything else there (null, a string,
an array) is no reward, said so. Once its entries that were no numbers were dropped first, and
`{"reward": false, "failed": 1}` scored 1, its only number. Without `reward`, the score is its
only number (Harbor's one-key metrics), booleans and reports beside it not counted; an object
naming several numbers and none `reward` names no score. Either way the number is finite and in
[0, 1], and a file that is no regular file (a link, a FIFO, a directory), past its size
(`REWARD_FILES`), or not what it should hold raises `RewardError` saying why. Harbor's own order
has changed since (its later verifiers read reward.json first); Tempered keeps reward.txt first
so that a script that guards its reward.txt (examples/harbor/fix-greeting) cannot be overruled
by a reward.json the workspace's code wrote. A script that writes reward.json must, for the same
reason, keep the code from writing reward.txt (remove it after the code ran), as one that writes
reward.txt keeps the code from its own.

A final workspace's links are read by the verifier too, as its kernel follows them: a link
into the verifier's own files (`VERIFIER_ONLY`: the hidden tests, the reward's directory, the
solution, /proc, the script's scratch) made a `cmp /app/primes.txt /tests/expected.txt` pass for
`ln -s /tests/expected.txt primes.txt`, no code of the agent's running at verify, and one to
/logs/verifier/reward.txt would have the script's own output written as the reward.
`verifier_links` names such links (`rel -> target`), resolved as the verifier's kernel resolves
them (relative to the link's directory, through the workspace's other links, `..` after each
link, the sandbox's /dev/fd into /proc, the host system's own links), and a link to a
directory above one of them (`/`, `/logs`); the check then scores the workspace 0 naming them
(`checks.check_script`). Links within the workspace, to the system (/usr/bin/python3), to
nothing, or in a loop are the workspace's own.
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import stat
from collections import deque
from pathlib import Path

from infra.environments.paths import MAX_LINKS
from infra.sandbox.forkserver import ROOT_ENTRIES
from infra.sandbox.workspace import SYSTEM_FILES

LOGS_DIR = "/logs/verifier"
REWARD_FILE = "reward.txt"
REWARD_JSON = "reward.json"
MAX_REWARD_BYTES = 64
"""The longest reward.txt: a number, with room for digits, a sign and spaces."""
MAX_REWARD_JSON_BYTES = 1 << 20
"""The longest reward.json: named rewards, with room for a report beside them."""
REWARD_FILES = {REWARD_FILE: MAX_REWARD_BYTES, REWARD_JSON: MAX_REWARD_JSON_BYTES}
"""The files a reward is read from, in Harbor's order (the first that exists), and their sizes."""
VERIFIER_ONLY = ("/tests", "/logs", "/solution", "/proc", "/tmp", "/dev/shm")
"""Where a final workspace's link may not lead its verifier: the hidden tests, the reward's
directory, the reference solution, /proc (its /proc/self/root is /), and the script's scratch
and HOME (what a test writes there to compare with)."""
SYSTEM_LINKED = ("/usr", *(f"/{name}" for name in ROOT_ENTRIES), *SYSTEM_FILES)
"""The host's trees a sandbox binds where they are (`forkserver.root_binds`, `SYSTEM_FILES`):
their links are followed as the host's."""
DEV_LINKS = {"/dev/fd": "/proc/self/fd", "/dev/core": "/proc/kcore", "/dev/ptmx": "pts/ptmx"}
DEV_LINKS |= {
    f"/dev/{name}": f"/proc/self/fd/{fd}" for fd, name in enumerate(("stdin", "stdout", "stderr"))
}
"""The links of a sandbox's /dev (bwrap's `--dev`)."""
MAX_LINK_WORK = 1 << 22
"""Path parts `verifier_links` walks in all: past it, the links left are not looked at and the
workspace is not verified (a tree of 2,000-part targets chained 40 deep would take minutes)."""
MAX_NAMED = 5
"""The links `verifier_links` names, at most."""
REWARD_KEY = "reward"
"""The name of the score among reward.json's named rewards (Harbor's standard key)."""


class NotARegularFile(OSError):
    """A path `read_regular` will not read: a FIFO, a directory, a device, a socket."""


class FileTooLarge(ValueError):
    """A file holding more bytes than its reader takes (`size`: how many it holds)."""

    def __init__(self, path: Path, size: int) -> None:
        super().__init__(f"{path}: {size} bytes")
        self.size = size


class RewardError(ValueError):
    """Why the reward file a script left is no reward (a whole sentence, naming the file)."""


def read_regular(path: Path, max_bytes: int, *, follow_links: bool = False) -> bytes:
    """The bytes of the regular file at `path`, at most `max_bytes` (else `FileTooLarge`). It
    is opened without waiting (a FIFO's open waits for a writer that may never come) and, unless
    `follow_links`, without following a link; its size is looked at before it is read, so a
    large (or sparse) file is never read. OSError where it is no regular file
    (`NotARegularFile`) or cannot be read."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_links else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):  # a directory opens, and its read was a fault
            raise NotARegularFile(f"{path}: not a regular file")
        if info.st_size > max_bytes:
            raise FileTooLarge(path, info.st_size)
        handle = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with handle:
        data = handle.read(info.st_size + 1)
        if len(data) > info.st_size:  # it grew since: read on to the limit
            data += handle.read(max_bytes + 1 - len(data))
    if len(data) > max_bytes:
        raise FileTooLarge(path, len(data))
    return data


def left_reward(logs: Path, where: str) -> float | None:
    """The score the script `where` left in `logs` (its /logs/verifier): its first reward file
    of `REWARD_FILES` that exists, read in full; None when there is none, `RewardError` saying
    why one is no reward."""
    for name, max_bytes in REWARD_FILES.items():
        shown = f"{LOGS_DIR}/{name}"
        try:
            data = read_regular(logs / name, max_bytes)
        except FileNotFoundError:
            continue
        except FileTooLarge:
            raise RewardError(f"{where}: {shown} holds more than {max_bytes} bytes") from None
        except NotARegularFile:
            raise RewardError(f"{where}: {shown} is not a regular file") from None
        except OSError as exc:  # a link (ELOOP), or one it cannot read
            raise RewardError(f"{where}: {shown} is not a regular file ({exc.strerror})") from None
        number = _json_reward(data, where, shown) if name == REWARD_JSON else _text_reward(data)
        if isinstance(number, str):
            raise RewardError(f"{where} wrote {number!r} to {shown}, not a number")
        if not math.isfinite(number):
            raise RewardError(f"{where} wrote the reward {number} to {shown}, not a finite number")
        if not 0.0 <= number <= 1.0:
            raise RewardError(f"{where} wrote the reward {number:g} to {shown}, outside [0, 1]")
        return number + 0.0  # -0.0 + 0.0 is 0.0: a score of "-0" nowhere
    return None


def _text_reward(data: bytes) -> float | str:
    """reward.txt's number (all of it: a number followed by more than fits was once read as
    the number), or its text (the first 20 characters) when it holds none."""
    text = data.decode("ascii", "replace").strip()
    try:
        return float(text)
    except ValueError:
        return text[:20]


def _json_reward(data: bytes, where: str, shown: str) -> float:
    """reward.json's score: its `REWARD_KEY` (a number, or a boolean as 1 or 0), else its
    only number."""
    try:
        rewards = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        why = str(exc)[:80] or exc.__class__.__name__
        raise RewardError(f"{where}: {shown} is not a JSON object ({why})") from None
    if not isinstance(rewards, dict):
        raise RewardError(f"{where}: {shown} is not a JSON object (a {type(rewards).__name__})")
    if REWARD_KEY in rewards:  # the score, whatever else the file holds
        value = rewards[REWARD_KEY]
        if isinstance(value, bool):  # Harbor's `float | int` takes a boolean as 1 or 0
            return float(value)
        if not isinstance(value, int | float):
            raise RewardError(
                f"{where}: {shown} names no number as the reward: its {REWARD_KEY!r} is "
                f"{_json_kind(value)}, not a number"
            )
    else:
        numbers = [
            value
            for value in rewards.values()
            if isinstance(value, int | float) and not isinstance(value, bool)
        ]
        if len(numbers) != 1:
            names = ", ".join(repr(key[:20]) for key in sorted(rewards)[:5])
            raise RewardError(
                f"{where}: {shown} names no number as the reward (one named {REWARD_KEY!r}, or "
                f"its only number; it holds {len(numbers)} numbers{' among ' if names else ''}"
                f"{names})"
            )
        [value] = numbers
    try:
        return float(value)
    except OverflowError:  # an integer of hundreds of digits
        raise RewardError(
            f"{where} wrote the reward {str(value)[:20]}… to {shown}, outside [0, 1]"
        ) from None


def _json_kind(value: object) -> str:
    """What a JSON value is, for an error: `null`, a string (its first characters), ..."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return f"a string ({value[:20]!r})"
    return "an array" if isinstance(value, list) else "an object"


def verifier_links(workspace: Path, workdir: str) -> list[str]:
    """The links of `workspace` (the final workspace, at `workdir` in the verifier's sandbox)
    that lead its verifier into `VERIFIER_ONLY`, or to a directory above one of them: `rel ->
    target` each, at most `MAX_NAMED`; one line more where there were more links than
    `MAX_LINK_WORK` lets it look at (not checked: not verified either)."""
    found: list[str] = []
    budget = [MAX_LINK_WORK]
    for top, dirs, files in os.walk(workspace):  # a link to a directory is listed, not entered
        for name in sorted([*dirs, *files]):
            path = os.path.join(top, name)
            if not os.path.islink(path):
                continue
            rel = os.path.relpath(path, workspace)
            try:
                forged = _leads_out(workspace, workdir, posixpath.join(workdir, rel), budget)
            except _OutOfWork:
                return [*found, f"links past {MAX_LINK_WORK} path parts, not looked at"]
            if forged:
                found.append(f"{rel} -> {os.readlink(path)}")
                if len(found) >= MAX_NAMED:
                    return found
    return found


class _OutOfWork(Exception):
    """`verifier_links` walked `MAX_LINK_WORK` path parts."""


def _under(path: str, roots: tuple[str, ...] | list[str]) -> bool:
    return any(path == root or path.startswith(f"{root}/") for root in roots)


def _leads_out(workspace: Path, workdir: str, path: str, budget: list[int]) -> bool:
    """Whether the sandbox's `path` (a link of the workspace), resolved as the verifier's kernel
    resolves it, passes through `VERIFIER_ONLY` or ends at a directory above one of them."""
    parts, current, hops = deque(path.split("/")), list[str](), 0
    while parts:
        budget[0] -= 1
        if budget[0] < 0:
            raise _OutOfWork
        part = parts.popleft()
        if part in ("", "."):
            continue
        if part == "..":
            current = current[:-1]
            continue
        current.append(part)
        here = "/" + "/".join(current)
        inside = _under(here, [workdir])
        if not inside and _under(here, VERIFIER_ONLY):
            return True
        target = _link_at(workspace, workdir, here, inside)
        if target is None:
            continue
        hops += 1
        if hops > MAX_LINKS:
            return False  # a loop: the kernel's ELOOP, nothing read through it
        current = [] if target.startswith("/") else current[:-1]
        parts.extendleft(reversed(target.split("/")))
    final = "/" + "/".join(current)
    return not _under(final, [workdir]) and any(
        root.startswith(final.rstrip("/") + "/") for root in VERIFIER_ONLY
    )


def _link_at(workspace: Path, workdir: str, here: str, inside: bool) -> str | None:
    """The target of the sandbox's `here` if it is a link (the parts above it are none), else
    None: the workspace's own, a sandbox's /dev, the host system's."""
    if inside:
        host = os.path.join(workspace, here[len(workdir) :].lstrip("/"))
    elif here in DEV_LINKS:
        return DEV_LINKS[here]
    elif _under(here, SYSTEM_LINKED):
        host = here
    else:
        return None
    try:
        return os.readlink(host)
    except OSError:  # no link, or nothing there
        return None
