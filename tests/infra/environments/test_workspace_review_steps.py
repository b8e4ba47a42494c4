"""What a step leaves, on real bwrap (tmpfs workspaces, as root), in the cases a review ran:
a deep directory whose name is not UTF-8 (once a RecursionError on every retry of the step),
the workspace root's mode (once no snapshot kept it: `chmod 000 .` broke the next step as a
platform fault, `chmod 555 .` made the live workspace differ from its restore), and a
`write_file` past the quota (once it truncated and half-wrote its file, which was stored)."""

from __future__ import annotations

import os

import pytest

from contracts.episode import ToolCall
from contracts.task import SandboxLimits
from tests.infra.environments.conftest import Rig, needs_root

pytestmark = [needs_root, pytest.mark.asyncio]
LIMITS = SandboxLimits(timeout_s=10)
FILES = {"calc.py": "def add(a, b):\n    return a - b\n", "README.md": "hi\n"}
NOT_UTF8 = "\"$(printf '\\377')\""
"""A name that is not UTF-8, as the shell writes it."""


def call(name: str, **arguments: object) -> ToolCall:
    return ToolCall(name=name, arguments=arguments)


def names(rig: Rig, session_id: str = "s0") -> list[bytes]:
    return sorted(os.listdir(os.fsencode(rig.host.sessions[session_id].workspace)))


async def test_a_deep_directory_whose_name_is_not_utf8_is_undone_as_a_utf8_ones_is(
    rig: Rig,
) -> None:
    """Its removal recursed once a level: a RecursionError, retried with the step rerun each
    time. Now the same error observation as the same nesting under a UTF-8 name, every try."""
    state = await rig.env.reset(rig.spec(FILES), "s0")
    command = f"mkdir -p {NOT_UTF8}/\"$(printf 'd/%.0s' $(seq 1200))\" && echo deep"
    for attempt in range(2):  # the activity's retry: the same state, the same number
        after, seen = await rig.env.step(state, call("bash", command=command), LIMITS, 1)
        assert seen.text.startswith("exit code: 0\nstdout:\ndeep"), (attempt, seen.text)
        assert (
            "nests directories deeper than 256 levels; the step's changes were undone" in seen.text
        )
        assert after.tree_digest == state.tree_digest
        assert names(rig) == [b"README.md", b"calc.py"]


async def test_a_directory_whose_name_is_not_utf8_is_removed_without_following_its_links(
    rig: Rig,
) -> None:
    """200 levels, files, an unreadable directory and a link to the workspace itself inside:
    all of it removed, nothing the link leads to."""
    state = await rig.env.reset(rig.spec(FILES), "s0")
    command = (
        f'd={NOT_UTF8}; mkdir -p "$d/$(printf \'d/%.0s\' $(seq 200))" "$d/shut/in" && '
        'echo x > "$d/d/f" && ln -s .. "$d/up" && ln -s ../calc.py "$d/d/calc" && '
        'chmod 0 "$d/shut" && echo made'
    )
    after, seen = await rig.env.step(state, call("bash", command=command), LIMITS, 1)
    assert seen.text.startswith("exit code: 0\nstdout:\nmade\nnote: removed \\xff: "), seen.text
    assert names(rig) == [b"README.md", b"calc.py"]
    _, seen = await rig.env.step(after, call("read_file", path="calc.py"), LIMITS)
    assert seen.text == FILES["calc.py"]


async def test_the_workspace_roots_mode_is_put_back_after_each_step(rig: Rig) -> None:
    """After `chmod 000 .` the next command's sandbox could not enter the workspace (a platform
    fault, retried); after `chmod 555 .` the live workspace was read-only and its restore was
    not. Now each step leaves the root 0700, live as restored."""
    spec = rig.spec(FILES)
    state = await rig.env.reset(spec, "s0")
    state, seen = await rig.env.step(
        state, call("bash", command="chmod 000 . && echo done"), LIMITS, 1
    )
    assert seen.text == "exit code: 0\nstdout:\ndone"
    _, seen = await rig.env.step(state, call("bash", command="ls; stat -c %a ."), LIMITS, 2)
    assert seen.text == "exit code: 0\nstdout:\nREADME.md\ncalc.py\n700"
    state, seen = await rig.env.step(
        state, call("bash", command="chmod 555 . && echo done"), LIMITS, 3
    )
    assert seen.text == "exit code: 0\nstdout:\ndone"
    state, seen = await rig.env.step(
        state, call("write_file", path="new.txt", content="x"), LIMITS, 4
    )
    assert seen.text == "wrote 1 bytes to new.txt"
    look = call("bash", command="touch t && stat -c %a . && ls")
    _, live = await rig.env.step(state, look, LIMITS, 5)
    restored = await rig.env.reset(spec, "s1", state.snapshot)
    _, again = await rig.env.step(restored, look, LIMITS, 5)
    assert live.text == again.text == "exit code: 0\nstdout:\n700\nREADME.md\ncalc.py\nnew.txt\nt"


async def test_a_write_file_past_the_quota_leaves_the_file_as_it_was(rig: Rig) -> None:
    """3 MB over calc.py in a 2 MB workspace: told ENOSPC, and calc.py (and the tree stored,
    which the verifier grades) is what it was, not truncated and half-written; a new file that
    does not fit is not left behind empty."""
    state = await rig.env.reset(rig.spec(FILES), "s0")
    workspace = rig.host.sessions["s0"].workspace
    for path in ("calc.py", "new.txt"):
        after, seen = await rig.env.step(
            state, call("write_file", path=path, content="# new\n" * 500_000), LIMITS, 1
        )
        assert seen.text == f"error: {path}: No space left on device"
        assert after.tree_digest == state.tree_digest
        assert (workspace / "calc.py").read_text() == FILES["calc.py"]
        assert names(rig) == [b"README.md", b"calc.py"]


async def test_write_file_rewrites_in_place_as_the_shell_does(rig: Rig) -> None:
    """What `echo > file` does, `write_file` does: a 1.2 MB file rewritten with 1.5 MB in a
    2 MB workspace needs no room for a second copy, and a hard link sees the new content."""
    state = await rig.env.reset(rig.spec(FILES), "s0")
    state, _ = await rig.env.step(
        state, call("bash", command="head -c 1200000 /dev/zero > big && ln calc.py alias"), LIMITS
    )
    state, seen = await rig.env.step(
        state, call("write_file", path="big", content="y" * 1_500_000), LIMITS
    )
    assert seen.text == "wrote 1500000 bytes to big"
    state, seen = await rig.env.step(
        state, call("write_file", path="calc.py", content="z\n"), LIMITS
    )
    assert seen.text == "wrote 2 bytes to calc.py"
    _, seen = await rig.env.step(state, call("bash", command="cat alias; wc -c < big"), LIMITS)
    assert seen.text == "exit code: 0\nstdout:\nz\n1500000"
