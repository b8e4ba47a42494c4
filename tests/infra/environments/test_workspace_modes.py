"""`read_file` and `write_file` against the shell, on real bwrap: a path with `..` after a link
names what `cat` reads, and `write_file` may write only what the session's own commands may
(the host is root, and before wrote past the agent's 0444 files and 0555 directories)."""

from __future__ import annotations

import pytest

from contracts.episode import ToolCall
from contracts.task import SandboxLimits
from tests.infra.environments.conftest import Rig, needs_root

pytestmark = [needs_root, pytest.mark.asyncio]
LIMITS = SandboxLimits(timeout_s=5)
FILES = {"x": "at root\n", "sub/x": "in sub\n", "sub/deep/keep": ""}


def call(name: str, **arguments: object) -> ToolCall:
    return ToolCall(name=name, arguments=arguments)


async def test_read_file_takes_dot_dot_after_a_link_as_cat_does(rig: Rig) -> None:
    state = await rig.env.reset(rig.spec(FILES), "s0")
    state, seen = await rig.env.step(state, call("bash", command="ln -s sub/deep d"), LIMITS)
    state, shell = await rig.env.step(state, call("bash", command="cat d/../x"), LIMITS)
    assert shell.text.endswith("in sub")
    for path in ("d/../x", "/app/d/../x"):
        _, seen = await rig.env.step(state, call("read_file", path=path), LIMITS)
        assert seen.text == "in sub\n", path


async def test_write_file_is_denied_what_the_sessions_commands_are(rig: Rig) -> None:
    """A 0444 file, a new file or directory in a 0555 directory, a file under a 0000 one: each
    the shell cannot write, and `write_file` is told so, the workspace unchanged; what the
    modes allow (a 0644 file in the 0555 directory) is written, and owned by the session."""
    state = await rig.env.reset(rig.spec(FILES), "s0")
    made = "echo ro > ro.txt; chmod 444 ro.txt; mkdir lock shut; echo w > lock/w.txt; "
    state, _ = await rig.env.step(
        state, call("bash", command=made + "chmod 555 lock; chmod 0 shut"), LIMITS
    )
    paths = ["ro.txt", "lock/new", "lock/sub/new", "shut/new"]
    tries = " ".join(f"echo z > {path};" for path in paths)
    _, shell = await rig.env.step(state, call("bash", command=tries), LIMITS)
    assert shell.text.count("Permission denied") == len(paths) - 1, shell.text  # no lock/sub
    for path in paths:
        after, seen = await rig.env.step(
            state, call("write_file", path=path, content="z\n"), LIMITS
        )
        assert seen.text == f"error: {path}: Permission denied", path
        assert after.tree_digest == state.tree_digest, path
    session = rig.host.sessions["s0"]
    assert (session.workspace / "ro.txt").read_text() == "ro\n"
    state, seen = await rig.env.step(
        state, call("write_file", path="lock/w.txt", content="z\n"), LIMITS
    )
    assert seen.text == "wrote 2 bytes to lock/w.txt"
    _, seen = await rig.env.step(state, call("bash", command="cat lock/w.txt"), LIMITS)
    assert seen.text.endswith("z")
    assert (session.workspace / "lock" / "w.txt").stat().st_uid == session.uid
