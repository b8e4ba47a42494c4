"""A snapshot keeps each file's mtime and a restore sets it, so a workspace restored from a
snapshot (a lost worker, a retried step, an undone one) compares times as the live one did:
`make` rebuilds in both or in neither. Real bwrap, as root.

Before, a restore wrote every file at the current time in path order: `foo.o`, restored after
`foo.c`, came out newer than the `foo.c` changed after it, and `make` said "up to date" in the
restored workspace only. A step that only touched a file was not stored at all.
"""

from __future__ import annotations

import asyncio

import pytest

from contracts.episode import ToolCall
from contracts.task import SandboxLimits
from tests.infra.environments.conftest import Rig, needs_root

pytestmark = [needs_root, pytest.mark.asyncio]
LIMITS = SandboxLimits(timeout_s=5)
STALE = ToolCall(
    name="bash", arguments={"command": "[ foo.c -nt foo.o ] && echo rebuild || echo up to date"}
)
TICK_S = 0.02
"""Longer than a tick of the clock file times come from (`snapshots.RACY_NS`)."""


def bash(command: str) -> ToolCall:
    return ToolCall(name="bash", arguments={"command": command})


async def test_a_restored_workspace_has_the_times_of_the_live_one(rig: Rig) -> None:
    spec = rig.spec({"foo.c": "v1\n"})
    state = await rig.env.reset(spec, "s0")
    state, _ = await rig.env.step(state, bash("cp foo.c foo.o"), LIMITS)
    await asyncio.sleep(TICK_S)
    edit = ToolCall(name="write_file", arguments={"path": "foo.c", "content": "v2\n"})
    state, _ = await rig.env.step(state, edit, LIMITS)
    _, live = await rig.env.step(state, STALE, LIMITS)
    restored = await rig.env.reset(spec, "s1", state.snapshot)
    _, again = await rig.env.step(restored, STALE, LIMITS)
    assert live.text == again.text == "exit code: 0\nstdout:\nrebuild"
    live_times, restored_times = (
        [
            (rig.host.sessions[sid].workspace / name).stat().st_mtime_ns
            for name in ("foo.c", "foo.o")
        ]
        for sid in ("s0", "s1")
    )
    assert live_times == restored_times  # to the ns


async def test_a_step_that_only_touches_a_file_is_stored(rig: Rig) -> None:
    spec = rig.spec({"foo.c": "v1\n"})
    state, _ = await rig.env.step(await rig.env.reset(spec, "s0"), bash("cp foo.c foo.o"), LIMITS)
    touched, _ = await rig.env.step(state, bash("touch -d '2001-01-01 UTC' foo.o"), LIMITS)
    assert touched.tree_digest == state.tree_digest and touched.snapshot != state.snapshot
    unchanged, _ = await rig.env.step(touched, bash("cat foo.o"), LIMITS)
    assert unchanged == touched  # nothing changed, times included: no snapshot
    restored = await rig.env.reset(spec, "s1", touched.snapshot)
    _, seen = await rig.env.step(restored, STALE, LIMITS)
    assert seen.text == "exit code: 0\nstdout:\nrebuild"
    assert (rig.host.sessions["s1"].workspace / "foo.o").stat().st_mtime_ns == 978307200 * 10**9
