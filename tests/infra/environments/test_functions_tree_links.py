"""A functions check of a workspace whose modules are links, on real bwrap: a link inside the
tree stands for its target's contents (a file, or a directory's files) under the link's path, as
Python in the workspace saw it; a link that leaves the tree, loops or dangles is named in the
verdict. Before, only regular files were copied: a correct module that was a link vanished at
grading (ModuleNotFoundError, 0/3, no word of the link)."""

from __future__ import annotations

import pytest

from contracts.episode import ToolCall
from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.environments.checks import program_files
from infra.environments.tree import Entry, Manifest, sha256
from tests.infra.environments.conftest import Rig, needs_root
from tests.infra.environments.test_workspace import FILES, FUNCTIONS, HIDDEN

LIMITS = SandboxLimits(timeout_s=10)
FIXED = "def add(a, b):\\n    return a + b\\n"  # printf's escapes


def bash(command: str) -> ToolCall:
    return ToolCall(name="bash", arguments={"command": command})


async def _verify_after(rig: Rig, command: str) -> tuple[str, float, ExecStatus, str]:
    """Run `command` as the agent's step over FILES, then check the final tree."""
    spec = rig.spec(FILES, HIDDEN, FUNCTIONS)
    state = await rig.env.reset(spec, "s0")
    state, seen = await rig.env.step(state, bash(command), LIMITS)
    graded = await rig.env.verify(spec, state, LIMITS)
    return seen.text, graded.score, graded.result.status, graded.result.detail


@needs_root
@pytest.mark.asyncio
async def test_a_module_that_is_a_link_to_a_file_is_checked(rig: Rig) -> None:
    command = (
        f"mkdir -p src && printf '{FIXED}' > src/calc_impl.py && rm calc.py "
        "&& ln -s src/calc_impl.py calc.py && python3 -c 'import calc; print(calc.add(1, 2))'"
    )
    seen, score, status, detail = await _verify_after(rig, command)
    assert seen.endswith("stdout:\n3"), seen
    assert (score, status) == (1.0, ExecStatus.PASSED), detail


@needs_root
@pytest.mark.asyncio
async def test_a_package_that_is_a_link_to_a_directory_is_checked(rig: Rig) -> None:
    command = (
        f"mkdir -p src/realpkg && printf '{FIXED}' > src/realpkg/core.py "
        "&& printf 'from .core import *\\n' > src/realpkg/__init__.py "
        "&& ln -s src/realpkg pkg && printf 'from pkg import add\\n' > calc.py "
        "&& python3 -c 'import calc; print(calc.add(1, 2))'"
    )
    seen, score, status, detail = await _verify_after(rig, command)
    assert seen.endswith("stdout:\n3"), seen
    assert (score, status) == (1.0, ExecStatus.PASSED), detail


@needs_root
@pytest.mark.asyncio
async def test_a_chain_of_links_is_followed_and_the_links_not_followed_are_named(
    rig: Rig,
) -> None:
    """calc.py → lib/calc.py → ../impl/calc.py (a chain, one relative to its own directory);
    beside it links that leave the tree, loop, dangle, or hold themselves (`here -> .`)."""
    command = (
        f"mkdir -p impl lib && printf '{FIXED}' > impl/calc.py && ln -s ../impl/calc.py lib/calc.py"
        " && rm calc.py && ln -s lib/calc.py calc.py && ln -s /etc/hostname outside"
        " && ln -s loop_b loop_a && ln -s loop_a loop_b"
        " && ln -s missing.txt dangling && ln -s . here"
        " && python3 -c 'import calc; print(calc.add(1, 2))'"
    )
    seen, score, status, detail = await _verify_after(rig, command)
    assert seen.endswith("stdout:\n3"), seen
    assert (score, status) == (1.0, ExecStatus.PASSED), detail
    for named in ("outside", "loop_a", "loop_b", "dangling", "here/here"):
        assert named in detail, detail
    assert "calc.py" not in detail.partition("links not followed")[2], detail


def _link(path: str, target: str) -> Entry:
    return Entry(path=path, kind="link", target=target)


def _file(path: str, data: bytes) -> Entry:
    return Entry(path=path, kind="file", sha256=sha256(data), size=len(data))


def test_links_follow_within_a_bound_and_never_leave_the_tree() -> None:
    """A chain of 41 links (Linux's bound is 40), and links through `..` past the root."""
    data = b"def add(a, b):\n    return a + b\n"
    chain = [_link(f"c{n:02d}.py", f"c{n + 1:02d}.py") for n in range(41)]
    entries = sorted(
        [
            *chain,
            _file("c41.py", data),
            _link("d/escape.py", "../../c41.py"),
            _link("d/ok.py", "../c41.py"),
            Entry(path="d", kind="dir"),
        ],
        key=lambda entry: entry.path,
    )
    copied = program_files(Manifest(entries=entries), {sha256(data): data})
    assert not isinstance(copied, str)
    assert copied.files["c01.py"] == data and copied.files["d/ok.py"] == data
    assert "c00.py" not in copied.files and "d/escape.py" not in copied.files
    assert "c00.py" in copied.left_out and "d/escape.py" in copied.left_out


def test_a_link_to_the_workspace_never_makes_its_python_too_large_to_check() -> None:
    """5 MB of Python and `mirror -> .`: the link's copy of it does not fit, and is named; the
    tree's own Python is checked (a link is never a reason for a score of 0 unchecked)."""
    big = b"#" * 5_000_000
    entries = [_file("big.py", big), _link("mirror", ".")]
    copied = program_files(Manifest(entries=entries), {sha256(big): big})
    assert not isinstance(copied, str)
    assert set(copied.files) == {"big.py"}
    assert "1 file past the 8 MiB a functions check copies: mirror/big.py" in copied.left_out
    assert "mirror/mirror -> . (a directory holding itself)" in copied.left_out
