"""A cancelled open or step holds its session until its thread has ended, and a verifier's
scratch directory frees its slot only once it is gone. Real hosts (tmpfs workspaces, as root):
one thread is held on a threading.Event at the narrowest seam (`host.empty` in a restore, the
`write_file` tool's `_write`, `host.discard`); a few removals fail (EBUSY).

Before, a cancel let go of the session's lock while the thread went on: the close that
followed removed the directory beside it and freed the slot, a retried open made the same
session at the same path, and the thread then remounted the new workspace (a restore's
`empty`) or wrote into it (`write_file`). A scratch directory whose removal failed, or was
cancelled, kept its slot for the worker's life, and nothing removed it.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contracts.episode import ToolCall
from contracts.task import SandboxLimits
from infra.environments import sessions as sessions_module
from infra.environments.mounts import mounts_under
from infra.environments.sessions import SessionHost
from tests.infra.environments.conftest import Rig, needs_root

pytestmark = [needs_root, pytest.mark.asyncio]
LIMITS = SandboxLimits(timeout_s=5)


class Held:
    """`owner.name`, whose first call (in its thread) waits for `go_on` before it runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: object, name: str) -> None:
        self.real: Callable[..., object] = getattr(owner, name)
        self.started, self.go_on, self.ended = (threading.Event() for _ in range(3))
        self.calls = 0
        monkeypatch.setattr(owner, name, self)

    def __call__(self, *args: object) -> object:
        self.calls += 1
        if self.calls > 1:
            return self.real(*args)
        self.started.set()
        self.go_on.wait(10)
        try:
            return self.real(*args)
        finally:
            self.ended.set()

    @property
    def running(self) -> bool:
        return self.started.is_set() and not self.ended.is_set()


def removals_beside(monkeypatch: pytest.MonkeyPatch, host: SessionHost, held: Held) -> list[Path]:
    """The removals asked for while `held`'s thread ran."""
    discard, beside = host.discard, []

    def noted(path: Path) -> None:
        if held.running:
            beside.append(path)
        discard(path)

    monkeypatch.setattr(host, "discard", noted)
    return beside


async def close_and_reopen_while_held(rig: Rig, cancelled: asyncio.Task[Any], held: Held) -> None:
    """Cancel `cancelled` while `held` runs, then close s-1 (the open's own cleanup, the
    workflow's close) and open it again (the retried open); both wait for the thread."""
    await asyncio.to_thread(held.started.wait, 10)
    cancelled.cancel()
    closing = asyncio.ensure_future(rig.env.close(["s-1"]))
    reopening = asyncio.ensure_future(rig.env.reset(rig.spec({"new.txt": "new"}), "s-1"))
    await asyncio.wait([closing, reopening], timeout=0.5)
    waited = not closing.done() and not reopening.done() and not cancelled.done()
    held.go_on.set()
    await asyncio.to_thread(held.ended.wait, 10)
    await asyncio.wait([cancelled, closing, reopening], timeout=10)
    assert cancelled.cancelled()
    state = reopening.result()
    session = rig.host.sessions["s-1"]
    assert os.listdir(session.workspace) == ["new.txt"], "the stale thread wrote into it"
    assert (session.workspace / "new.txt").stat().st_uid == session.uid
    assert mounts_under(rig.host.directory) == [session.workspace]
    assert rig.trees.get_manifest(state.snapshot).digest() == state.tree_digest
    assert waited, "the close did not wait for the cancelled thread"


async def test_an_open_cancelled_mid_restore_is_removed_only_once_its_thread_ends(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held in `empty` (a tmpfs remounted, thousands of files written): before, the removal ran
    at once, and the stale `empty` then unmounted the new session's tmpfs and mounted its own."""
    spec = rig.spec({"old.txt": "old"})
    empty = Held(monkeypatch, rig.host, "empty")
    beside = removals_beside(monkeypatch, rig.host, empty)
    opening = asyncio.ensure_future(rig.env.reset(spec, "s-1"))
    await close_and_reopen_while_held(rig, opening, empty)
    assert beside == [] and empty.calls == 2


async def test_a_step_cancelled_mid_write_is_removed_only_once_its_thread_ends(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held in `write_file`: before, the removal ran at once, and the stale write landed in the
    new session's workspace."""
    state = await rig.env.reset(rig.spec({"old.txt": "old"}), "s-1")
    write = Held(monkeypatch, rig.env, "_write")
    beside = removals_beside(monkeypatch, rig.host, write)
    late = ToolCall(name="write_file", arguments={"path": "late.txt", "content": "late"})
    stepping = asyncio.ensure_future(rig.env.step(state, late, LIMITS))
    await close_and_reopen_while_held(rig, stepping, write)
    assert beside == [] and write.calls == 1


def busy(monkeypatch: pytest.MonkeyPatch, host: SessionHost, times: int) -> list[Path]:
    """Removals of verifier scratch directories fail (EBUSY) `times` times; returns those asked."""
    discard, asked = host.discard, []

    def busy_then_discard(path: Path) -> None:
        if path.name.startswith("verify-"):
            asked.append(path)
            if len(asked) <= times:
                raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))
        discard(path)

    monkeypatch.setattr(host, "discard", busy_then_discard)
    return asked


async def test_a_verifier_scratch_that_fails_to_go_keeps_its_slot_until_the_sweeper_removes_it(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sessions_module, "SWEEP_S", 0.2)
    spec = rig.spec({"a.txt": "a"})
    state = await rig.env.reset(spec, "s0")
    free = len(rig.host._free)
    asked = busy(monkeypatch, rig.host, times=1)
    with pytest.raises(OSError, match="busy"):
        await rig.env.verify(spec, state, LIMITS)
    assert len(rig.host._free) == free - 1 and asked[0].is_dir()  # both still in use
    deadline = time.monotonic() + 3
    while len(rig.host._free) < free and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert asked == [asked[0]] * 2 and not asked[0].exists(), "the sweeper did not remove it"
    assert len(rig.host._free) == free and rig.host.leftovers == {}
    assert mounts_under(rig.host.directory) == [rig.host.sessions["s0"].workspace]


async def test_a_verify_cancelled_twice_mid_removal_waits_for_it_and_frees_the_slot(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = rig.spec({"a.txt": "a"})
    state = await rig.env.reset(spec, "s0")
    free = len(rig.host._free)
    removal = Held(monkeypatch, rig.host, "discard")
    verifying = asyncio.ensure_future(rig.env.verify(spec, state, LIMITS))
    await asyncio.to_thread(removal.started.wait, 10)
    for _ in range(2):
        verifying.cancel()
        await asyncio.wait([verifying], timeout=0.2)
    waited = not verifying.done()
    removal.go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await verifying
    assert waited and removal.ended.is_set() and len(rig.host._free) == free
    assert rig.host.leftovers == {} and [p.name for p in rig.host.directory.iterdir()] == ["s0"]
