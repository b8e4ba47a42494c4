"""A session whose removal fails keeps its uid slot and its directory tracked until a retry
removes them: the next close of its id, or the sweeper's next round (which a failure does not
end). Real hosts (tmpfs workspaces, as root); only `SessionHost.discard` fails, a set number
of times. Before, the session was forgotten before its removal: its directory and slot stayed
in use for the worker's life, and neither a close nor the sweeper found it again.
"""

from __future__ import annotations

import asyncio
import errno
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


@pytest.mark.asyncio
async def test_a_close_cancelled_while_removing_is_finished_by_the_next(
    host: SessionHost, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A close_sessions activity cancelled while the removal runs in its thread: the session
    stays closing (its slot held) and the next close frees it."""
    session = host.create("s-1", SPEC)
    discard, removing, go_on = host.discard, threading.Event(), threading.Event()

    def slow_discard(path: Path) -> None:
        removing.set()
        go_on.wait(10)
        discard(path)

    monkeypatch.setattr(host, "discard", slow_discard)
    closing = asyncio.ensure_future(host.close(["s-1"]))
    await asyncio.to_thread(removing.wait, 10)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert "s-1" not in host.sessions and held(host, session)
    go_on.set()  # the cancelled removal's thread ends; the session is still closing
    deadline = time.monotonic() + 10
    while session.directory.exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert session.slot not in host._free  # until a close finishes the removal
    assert await host.close(["s-1"]) == 1
    assert not session.directory.exists() and session.slot in host._free
