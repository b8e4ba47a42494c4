"""A session whose removal fails keeps its uid slot and its directory tracked until a retry
removes them: the next close of its id, or the sweeper's next round (which a failure does not
end). Real hosts (tmpfs workspaces, as root); only `SessionHost.discard` fails, a set number
of times. Before, the session was forgotten before its removal: its directory and slot stayed
in use for the worker's life, and neither a close nor the sweeper found it again.

A close cancelled while its removal runs leaves that removal running, the only one: later
closes, the sweeper and shutdown await it (only `discard` is slowed, on a threading.Event).
"""

from __future__ import annotations

import asyncio
import errno
import gc
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from contracts.common import ObjectRef
from contracts.task import WorkspaceSpec
from infra.environments import sessions as sessions_module
from infra.environments.mounts import mounts_under, remove_tree
from infra.environments.sessions import Session, SessionHost
from infra.settings import WorkspaceSettings
from tests.infra.environments.conftest import session_root

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (workspace uids)")
NOWHERE = ObjectRef(key="unused", size=0, sha256="0" * 64)
SPEC = WorkspaceSpec(files=NOWHERE, verifier=NOWHERE)


@pytest_asyncio.fixture
async def host() -> AsyncIterator[SessionHost]:
    host = SessionHost(WorkspaceSettings(root=session_root()))
    try:
        yield host
    finally:
        await host.shutdown()
        remove_tree(host.root)


def fail_removing(
    host: SessionHost, monkeypatch: pytest.MonkeyPatch, session: Session, times: int
) -> list[Path]:
    """Make removing `session`'s directory fail `times` times (EBUSY, as an unmount still in
    use); returns the paths each removal was asked for."""
    discard, asked = host.discard, []

    def busy_then_discard(path: Path) -> None:
        asked.append(path)
        if path == session.directory and asked.count(path) <= times:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))
        discard(path)

    monkeypatch.setattr(host, "discard", busy_then_discard)
    return asked


def held(host: SessionHost, session: Session) -> bool:
    """Whether the session still holds its slot and its directory."""
    return session.slot not in host._free and session.directory.exists()


@pytest.mark.asyncio
async def test_a_failed_close_keeps_the_slot_and_the_next_close_releases_it(
    host: SessionHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = host.create("s-1", SPEC), host.create("s-2", SPEC)
    (first.workspace / "file").write_text("left")
    fail_removing(host, monkeypatch, first, times=1)
    with pytest.raises(OSError, match="busy"):  # the caller gets the error, as before
        await host.close(["s-1", "s-2"])
    assert "s-1" not in host.sessions and held(host, first)  # a step finds it no more
    with pytest.raises(ValueError, match="exists"):  # its directory is still there
        host.create("s-1", SPEC)
    assert await host.close(["s-1"]) == 1  # a retried close_sessions, or a reset's close
    assert not first.directory.exists() and first.slot in host._free
    assert host.sessions == host.closing == {} and mounts_under(host.directory) == []
    assert not second.directory.exists() and second.slot in host._free  # tried all the same
    assert host.create("s-1", SPEC).directory == first.directory


@pytest.mark.asyncio
async def test_the_sweeper_retries_a_failed_close_until_it_succeeds(
    host: SessionHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The close fails, and so does the sweeper's first retry: the sweeper goes on, and its
    next round removes the session and frees its slot."""
    monkeypatch.setattr(sessions_module, "SWEEP_S", 0.2)
    session = host.create("s-1", SPEC)
    asked = fail_removing(host, monkeypatch, session, times=2)
    with pytest.raises(OSError, match="busy"):
        await host.close(["s-1"])
    deadline = time.monotonic() + 10
    while session.slot not in host._free and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert asked.count(session.directory) == 3, asked  # the close, then two sweeps
    assert not session.directory.exists() and session.slot in host._free
    assert host.closing == {} and mounts_under(host.directory) == []
    assert host._sweeper is not None and not host._sweeper.done()


class SlowRemoval:
    """`host.discard` of one session's directory, counted: the first blocks until `go_on`
    (a large tree, a slow unmount), then removes it or, with `fail`, raises EBUSY."""

    def __init__(
        self, host: SessionHost, monkeypatch: pytest.MonkeyPatch, session: Session, fail: bool
    ) -> None:
        self.discard, self.path, self.fail = host.discard, session.directory, fail
        self.started, self.go_on, self.ended = (threading.Event() for _ in range(3))
        self.calls = self.running = self.most = 0
        """Removals of the directory asked for; running now; most running at once."""
        self.guard = threading.Lock()
        monkeypatch.setattr(host, "discard", self)

    def __call__(self, path: Path) -> None:
        if path != self.path:
            return self.discard(path)
        with self.guard:
            self.calls += 1
            self.running += 1
            self.most, first = max(self.most, self.running), self.calls == 1
        try:
            if first:
                self.started.set()
                self.go_on.wait(10)
                if self.fail:
                    raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))
            self.discard(path)
        finally:
            with self.guard:
                self.running -= 1
            if first:
                self.ended.set()


async def cancelled_mid_removal(host: SessionHost, removal: SlowRemoval) -> None:
    """A close of s-1 cancelled while its removal runs in its thread (a cancelled open's
    `reset`, a worker's shutdown cancelling close_sessions)."""
    closing = asyncio.ensure_future(host.close(["s-1"]))
    await asyncio.to_thread(removal.started.wait, 10)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing


@pytest.mark.asyncio
async def test_a_close_cancelled_mid_removal_leaves_one_removal_that_later_closes_await(
    host: SessionHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Then a second close (the sweeper's) and a retried open's `reset` of the same id: both
    await the one removal, and the new session survives it. Before, the second close ran a
    second removal at once and freed the slot; the reset made the same directory again, and
    the first removal, going on, deleted it."""
    old = host.create("s-1", SPEC)
    removal = SlowRemoval(host, monkeypatch, old, fail=False)
    await cancelled_mid_removal(host, removal)
    assert "s-1" not in host.sessions and host.closing == {"s-1": old} and held(host, old)
    with pytest.raises(ValueError, match="exists"):
        host.create("s-1", SPEC)

    async def reopen() -> Session:  # WorkspaceEnvironment.reset
        await host.close(["s-1"])
        return host.create("s-1", SPEC)

    second, reopened = asyncio.ensure_future(host.close(["s-1"])), asyncio.ensure_future(reopen())
    await asyncio.wait([second, reopened], timeout=1)
    waited = not second.done() and not reopened.done()
    removal.go_on.set()
    await asyncio.to_thread(removal.ended.wait, 10)
    new = await reopened
    assert new.workspace.is_dir(), "the first removal deleted the new session's directory"
    assert host.sessions == {"s-1": new} and new.slot not in host._free
    if host.tmpfs:
        assert mounts_under(host.directory) == [new.workspace]
    assert (removal.calls, removal.most) == (1, 1)  # one removal, never two at once
    assert waited and await second == 0  # counted by none: its close was cancelled
    assert host.closing == {} and old.removing is None


@pytest.mark.asyncio
async def test_shutdown_awaits_the_removal_of_a_cancelled_close(
    host: SessionHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, shutdown ran a second removal beside it (and was done before it)."""
    session = host.create("s-1", SPEC)
    (session.workspace / "file").write_text("left")
    removal = SlowRemoval(host, monkeypatch, session, fail=False)
    await cancelled_mid_removal(host, removal)
    shutdown = asyncio.ensure_future(host.shutdown())
    await asyncio.wait([shutdown], timeout=1)
    waited = not shutdown.done()
    removal.go_on.set()
    await shutdown
    assert waited and (removal.calls, removal.most) == (1, 1)
    assert removal.ended.is_set() and not host.directory.exists()
    assert host.closing == {} and mounts_under(host.root) == []


@pytest.mark.asyncio
async def test_a_removal_that_fails_after_its_close_was_cancelled_is_retried_by_the_next(
    host: SessionHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The removal goes on without its close and fails: the session stays closing, its slot
    held (its error logged, not left unretrieved), and the next close removes it."""
    session = host.create("s-1", SPEC)
    removal = SlowRemoval(host, monkeypatch, session, fail=True)
    loop, unhandled = asyncio.get_running_loop(), []
    loop.set_exception_handler(lambda _, context: unhandled.append(context))
    try:
        await cancelled_mid_removal(host, removal)
        removal.go_on.set()
        deadline = time.monotonic() + 10
        while session.removing is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        gc.collect()
        assert unhandled == [] and host.closing == {"s-1": session} and held(host, session)
    finally:
        loop.set_exception_handler(None)
    assert await host.close(["s-1"]) == 1
    assert removal.calls == 2 and not session.directory.exists() and session.slot in host._free
    assert host.closing == {} and mounts_under(host.directory) == []
