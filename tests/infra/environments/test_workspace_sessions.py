"""A step holds its session: the TTL sweeper leaves a session open while a step of it waits or
runs and for `ttl_s` after it ends, and checks again just before each close; `solve` runs from
its state as a step does, and so does a retried step. Real hosts (tmpfs workspaces, as root),
the sweeper every 20 ms; the commands are a fake runner's, held on an asyncio.Event.

Before, a session was idle from the start of its last step: a command longer than `ttl_s` was
closed under it, and so was a session whose step began while the sweeper closed another (its
list was taken once). `solve` ran in whatever tree its session held, and a failure left the
session's snapshot as if the tree were still that one. A retried step (its number again) whose
only change no snapshot holds ran on top of its first attempt.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from contracts.common import ObjectRef
from contracts.episode import ToolCall
from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.environments import sessions as sessions_module
from infra.environments.sessions import Session
from infra.environments.tree import pack_files
from infra.environments.workspace import WorkspaceEnvironment
from infra.sandbox.workspace import CommandResult, Mounts
from tests.infra.environments.conftest import UNHELD, Rig, needs_root
from tests.infra.environments.test_workspace_cancel import Held

pytestmark = [needs_root, pytest.mark.asyncio]
LIMITS = SandboxLimits(timeout_s=5)
READ = ToolCall(name="read_file", arguments={"path": "a.txt"})
ROOT_TIME = ToolCall(name="bash", arguments={"command": "stat -c %Y .; touch -d @1 ."})
"""Prints the mtime of the workspace's directory, then sets it to 1 as `UNHELD` does."""
SWEEPS = 0.2
"""Long enough for some ten rounds of the sweeper."""


class HeldRunner:
    """Runs no command: each waits for `go_on`, then passes (or, given an `error`, writes
    `left.txt` into the workspace and raises it)."""

    def __init__(self, error: Exception | None = None) -> None:
        self.running, self.go_on, self.error = asyncio.Event(), asyncio.Event(), error

    async def run(
        self, command: str, mounts: Mounts, uid: int, limits: SandboxLimits, name: str
    ) -> CommandResult:
        self.running.set()
        await self.go_on.wait()
        if self.error is not None:
            (mounts.workspace / "left.txt").write_text("left")
            raise self.error
        return CommandResult(ExecStatus.PASSED, 0, "", "", False, 0)


@pytest.fixture(autouse=True)
def fast_sweeper(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sessions_module, "SWEEP_S", 0.02)


def aged(rig: Rig, session: Session) -> None:
    """As if nothing had touched the session for longer than its TTL."""
    session.last_used = time.monotonic() - 2 * rig.host.config.ttl_s


async def test_a_command_longer_than_the_ttl_keeps_its_session(rig: Rig) -> None:
    state = await rig.env.reset(rig.spec({"a.txt": "a"}), "s0")
    runner = HeldRunner()
    env = WorkspaceEnvironment(rig.host, rig.trees, runner, None)  # type: ignore[arg-type]
    bash = ToolCall(name="bash", arguments={"command": "sleep 3600"})
    stepping = asyncio.ensure_future(env.step(state, bash, LIMITS))
    await asyncio.wait_for(runner.running.wait(), 5)
    session = rig.host.sessions["s0"]
    aged(rig, session)  # the command has run for longer than the TTL
    await asyncio.sleep(SWEEPS)
    runner.go_on.set()
    after, _ = await stepping
    await asyncio.sleep(SWEEPS)  # its idle time starts at its end
    assert rig.host.sessions.get("s0") is session, "the sweeper closed it under its step"
    assert time.monotonic() - session.last_used < 2 * SWEEPS + 1
    _, seen = await rig.env.step(after, READ, LIMITS)
    assert seen.text == "a"


async def test_a_step_waiting_for_a_slot_keeps_its_session(rig: Rig) -> None:
    """`busy` is what a caller that queues steps (`env_step`'s sandbox slots) holds."""
    state = await rig.env.reset(rig.spec({"a.txt": "a"}), "s0")
    session = rig.host.sessions["s0"]
    with rig.host.busy("s0"):  # the item is received, and waits
        aged(rig, session)
        await asyncio.sleep(SWEEPS)
        _, seen = await rig.env.step(state, READ, LIMITS)
    assert seen.text == "a"
    await asyncio.sleep(SWEEPS)
    assert rig.host.sessions.get("s0") is session and session.busy == 0


async def test_a_session_whose_step_begins_while_the_sweeper_closes_another_stays_open(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = rig.spec({"a.txt": "a"})
    await rig.env.reset(spec, "s0")
    later = await rig.env.reset(spec, "s1")
    idle, stepped = rig.host.sessions["s0"], rig.host.sessions["s1"]
    removal = Held(monkeypatch, rig.host, "discard")
    aged(rig, idle)
    aged(rig, stepped)  # both idle when the sweeper lists them
    await asyncio.to_thread(removal.started.wait, 10)  # it removes s0 first
    _, seen = await rig.env.step(later, READ, LIMITS)  # meanwhile s1 takes a step
    removal.go_on.set()
    await asyncio.to_thread(removal.ended.wait, 10)
    await asyncio.sleep(SWEEPS)
    assert seen.text == "a" and "s0" not in rig.host.sessions
    assert rig.host.sessions.get("s1") is stepped, "closed by the sweeper's stale list"


def solution(rig: Rig, script: str) -> ObjectRef:
    return rig.add(pack_files({"solve.sh": script})).ref


async def test_solve_runs_from_the_state_it_is_given(rig: Rig) -> None:
    """A session holding a later tree (a retried validation) is restored first."""
    first = await rig.env.reset(rig.spec({"a.txt": "a"}), "s0")
    write = ToolCall(name="write_file", arguments={"path": "later.txt", "content": "later"})
    await rig.env.step(first, write, LIMITS)
    solved, seen = await rig.env.solve(first, solution(rig, "echo x > b.txt\n"), LIMITS)
    assert seen.text == "exit code: 0", seen.text
    paths = [entry.path for entry in rig.trees.get_manifest(solved.snapshot).entries]
    assert paths == ["a.txt", "b.txt"]


async def test_a_failed_solve_leaves_its_session_to_be_restored(rig: Rig) -> None:
    state = await rig.env.reset(rig.spec({"a.txt": "a"}), "s0")
    runner = HeldRunner(OSError("the sandbox broke"))
    runner.go_on.set()
    env = WorkspaceEnvironment(rig.host, rig.trees, runner, None)  # type: ignore[arg-type]
    with pytest.raises(OSError, match="sandbox broke"):
        await env.solve(state, solution(rig, "true\n"), LIMITS)
    left = ToolCall(name="read_file", arguments={"path": "left.txt"})
    _, seen = await rig.env.step(state, left, LIMITS)  # restored first: the tree `state` names
    assert seen.text == "error: left.txt: no such file"


async def test_a_retried_step_runs_from_its_state_though_its_snapshot_missed_its_effect(
    rig: Rig,
) -> None:
    """The step left the tree digest as it was (its only change, the time of the workspace's
    directory, is one no snapshot holds); its retry (the same number: an attempt that timed out
    after it ran) is restored first. A later number runs in the workspace as it is."""
    state = await rig.env.reset(rig.spec({"a.txt": "a"}), "s0")
    after, seen = await rig.env.step(state, UNHELD, LIMITS, 1)
    assert after.snapshot == state.snapshot and seen.text == "exit code: 0\nstdout:\n644"
    _, again = await rig.env.step(state, ROOT_TIME, LIMITS, 1)
    assert again.text != "exit code: 0\nstdout:\n1", "the retry repeated the step's effect"
    _, later = await rig.env.step(after, ROOT_TIME, LIMITS, 2)
    assert later.text == "exit code: 0\nstdout:\n1"
