"""Workspace sessions on one sandbox worker: their directories, uids, TTL, and the sweeps.

    host = SessionHost(settings.sandbox.workspaces)         # sweeps what dead workers left
    session = host.create("s3-1a2b3c4d", WorkspaceSpec(...))
    ... steps (infra/environments/workspace.py) ...
    await host.close(["s3-1a2b3c4d"])                       # or the TTL sweeper does it

On disk, each worker process owns one directory named by its pid and the kernel's start time
of that pid (`dead_workers.worker_dir_name`):

    <root>/                               0711, marked as Tempered's (`dead_workers.claim_root`)
    <root>/<pid>-<start>/                 root-owned, 0711
        <session id>/ws/                  the workspace, owned by the session's uid, 0700:
                                          a tmpfs of max_workspace_mb where the worker may
                                          mount one (`mounts.py`: a disk quota)
        verify-<n>/                       a verifier's scratch trees (workspace, tests, logs)

Every session and verifier run holds one uid slot (`infra/sandbox/workspace.session_uid`):
its own uid, its own cgroups (`<pid>-w<slot>`). When a worker starts it removes what dead
workers left (`dead_workers.sweep_dead`: directories, processes, cgroups). A session idle for
`ttl_s` is closed by the sweeper task; its last snapshot stays in the store, so a later step
restores it (`SessionLost` → `open_sessions` with the snapshot). The sweeper also removes,
within `SWEEP_S`, what workers that died after this one started left behind.

A session is not idle while a step holds it (`busy`: from its call, a wait for the lock
included, or from the receipt of its item by a caller that queues it), and its idle time
starts when the step ends; the sweeper checks each session again just before closing it.
Before, a command longer than `ttl_s` (900 s by default; a step may run 3,600) was closed.

Closing a session forgets it at once (a step no longer finds it: `SessionLost`), but it keeps
its uid slot until its directory (and tmpfs) is gone: a removal that fails (EBUSY, EIO) leaves
it in `closing`, and the next close of its id or the sweeper's next round tries again; the
close's caller still gets the error (the sweeper logs it). Before, the session was forgotten
first, and its directory and slot stayed in use for the worker's life.

A session has one removal at a time (`Session.removing`), shielded from the closes that await
it: a close cancelled meanwhile (a cancelled open's `reset`, a worker's shutdown cancelling a
close_sessions) gets its CancelledError while the removal goes on, holding the session's lock
and its `closing` entry until its thread ends; a later close of the id, the sweeper and
`shutdown` await that removal instead of starting another. Before, a cancelled close let the
next one run a second `remove_tree` of the same path at once: the first could then delete the
directory of a new session of the same id, made in between.

A thread cannot be stopped: every one started under a session's lock, or writing into a
directory that a removal takes next, runs through `in_thread`, whose cancel is raised only once
the thread has ended. Before, a cancelled open (its restore) or step (its scan, a write_file)
let go of the lock at once: the close that followed removed the directory beside the thread,
freed the slot, and the thread then wrote into (or remounted) a new session made at the path.

A verifier's scratch directory frees its slot only once it is gone (`discard_scratch`); one
whose removal fails waits in `leftovers` for the sweeper's next round (or shutdown), as a
closing session does. Before, a failed (or cancelled) removal kept the slot, and left the
directory, for the worker's life.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import stat
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from contracts.common import ObjectRef
from contracts.task import WorkspaceSpec
from infra.environments.dead_workers import claim_root, sweep_dead, worker_dir_name
from infra.environments.mounts import mount_tmpfs, remove, remove_tree, unmount
from infra.environments.snapshots import MAX_ENTRIES, Scanner
from infra.environments.threads import in_thread
from infra.environments.tree import Manifest
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.workspace import SLOTS, session_uid
from infra.settings import WorkspaceSettings

log = logging.getLogger("tempered.sessions")
SWEEP_S = 30.0
"""How often the sweeper looks for idle sessions and dead workers' leftovers."""
WORKSPACE_MODE = 0o700
"""A workspace root's mode, as made and as each step leaves it (`Session.reset_root_mode`)."""


@dataclass
class Session:
    """One episode's workspace on this worker, and its last durable state."""

    id: str
    slot: int
    directory: Path
    spec: WorkspaceSpec
    scanner: Scanner
    snapshot: ObjectRef | None = None
    manifest: Manifest | None = None
    """The tree `snapshot` names (None with it: the workspace must be restored)."""
    applied: int = -1
    """The number of the last step that may have changed it: one at or below it is a retry."""
    last_used: float = field(default_factory=time.monotonic)
    """When its last step ended (`SessionHost.busy`), or it was made."""
    busy: int = 0
    """Opens and steps that hold it (`SessionHost.busy`): the sweeper leaves it open meanwhile."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    removing: asyncio.Task[None] | None = None
    """Its directory's removal under way, once closed (`SessionHost.close`): one at a time."""

    @property
    def uid(self) -> int:
        return session_uid(self.slot)

    @property
    def workspace(self) -> Path:
        return self.directory / "ws"

    def reset_root_mode(self) -> None:
        """Put the workspace root back to `WORKSPACE_MODE` (after a step, before its snapshot).
        No tree holds the root's mode, so the agent's `chmod 555 .` made the live workspace
        differ from its restore, and `chmod 000 .` kept the next command's sandbox out of it (a
        platform fault, retried). Its owner is not the agent's to change."""
        os.chmod(self.workspace, WORKSPACE_MODE)


class SessionHost:
    """The sessions of this worker process."""

    def __init__(self, config: WorkspaceSettings) -> None:
        self.config = config
        self.root = config.root
        claim_root(self.root)  # refused: a directory of the user's, /tmp
        if blocked := [p for p in self.root.parents if not p.stat().st_mode & stat.S_IXOTH]:
            raise SandboxInfraError(
                f"sandbox uids cannot reach {self.root}: {blocked[0]} is not searchable by "
                "others (o+x); set sandbox.workspaces.root elsewhere"
            )
        self.swept = sweep_dead(self.root)
        self.directory = self.root / worker_dir_name()
        self.directory.mkdir(mode=0o711)
        self.directory.chmod(0o711)
        self.tmpfs = self._can_mount()
        """Whether each workspace is a tmpfs of its own (`WorkspaceSettings.disk`)."""
        self.sessions: dict[str, Session] = {}
        self.closing: dict[str, Session] = {}
        """Sessions forgotten but not yet removed (a removal under way, or one that failed and
        waits for its retry): each still holds its slot and directory."""
        self.leftovers: dict[Path, int] = {}
        """Verifier scratch directories whose removal failed, each with the slot it holds."""
        self._free = list(range(SLOTS - 1, -1, -1))
        self._scratch = itertools.count()
        self._sweeper: asyncio.Task[None] | None = None

    def _can_mount(self) -> bool:
        disk = self.config.disk
        if disk == "directory" or (disk == "auto" and os.geteuid() != 0):
            return False
        probe = self.directory / "probe"
        probe.mkdir()
        try:
            mount_tmpfs(probe, 1 << 20, 16, os.geteuid())
            unmount(probe)
        except OSError as exc:
            if disk == "tmpfs":
                raise SandboxInfraError(
                    f"sandbox.workspaces.disk is tmpfs, but this worker cannot mount one "
                    f"({exc.strerror}: it needs CAP_SYS_ADMIN); set it to `directory` for "
                    "workspaces without a disk quota"
                ) from exc
            log.warning("workspaces are directories, without a disk quota: %s", exc)
            return False
        finally:
            probe.rmdir()
        return True

    def take_slot(self) -> int:
        if not self._free:
            raise SandboxInfraError(f"more than {SLOTS} sessions and checks on one worker")
        return self._free.pop()

    def release_slot(self, slot: int) -> None:
        self._free.append(slot)

    def create(self, session_id: str, spec: WorkspaceSpec) -> Session:
        """A new, empty session (its workspace directory exists, owned by its uid)."""
        if session_id in self.sessions or session_id in self.closing:
            raise ValueError(f"session {session_id} exists")
        slot = self.take_slot()
        directory = self.directory / session_id
        session = Session(session_id, slot, directory, spec, Scanner(self.quota_bytes))
        try:
            directory.mkdir(mode=0o711)
            session.workspace.mkdir(mode=WORKSPACE_MODE)
            self._prepare(session)
        except BaseException:
            remove_tree(directory)
            self.release_slot(slot)
            raise
        self.sessions[session_id] = session
        self.start_sweeper()
        return session

    @property
    def quota_bytes(self) -> int:
        return self.config.max_workspace_mb << 20

    def _prepare(self, session: Session) -> None:
        """Make the session's empty workspace directory its uid's, and its tmpfs if any."""
        if not self.quota(session.workspace, session.uid) and os.geteuid() == 0:
            os.chown(session.workspace, session.uid, session.uid)

    def quota(self, path: Path, uid: int, mode: int = WORKSPACE_MODE) -> bool:
        """Give the empty directory `path` a workspace's quota, a tmpfs of its own owned by
        `uid`, where workspaces have one; returns whether it did."""
        if self.tmpfs:
            mount_tmpfs(path, self.quota_bytes, MAX_ENTRIES + 1, uid, mode)
        return self.tmpfs

    def empty(self, session: Session) -> None:
        """Make the session's workspace empty again (a fresh tmpfs)."""
        if self.tmpfs:
            unmount(session.workspace)
        remove(session.workspace)
        session.workspace.mkdir(mode=WORKSPACE_MODE)
        self._prepare(session)

    @contextlib.asynccontextmanager
    async def scratch(self) -> AsyncIterator[tuple[Path, int]]:
        """A fresh directory for one verifier run and a uid slot for it; where workspaces have
        a quota, a tmpfs of one quota for the tests and the logs (the final workspace gets one
        of its own: `quota`). At the end it is removed, then the slot freed (`discard_scratch`)."""
        slot, path = self.take_slot(), self.directory / f"verify-{next(self._scratch)}"
        self.start_sweeper()  # for its retry, should the removal fail
        try:
            path.mkdir(mode=0o711)
            self.quota(path, os.geteuid(), 0o711)
        except BaseException:
            with contextlib.suppress(Exception):  # logged; its error is not this one's
                await self.discard_scratch(path, slot)
            raise
        try:
            yield path, slot
        finally:
            await self.discard_scratch(path, slot)

    @staticmethod
    def discard(path: Path) -> None:
        remove_tree(path)

    async def discard_scratch(self, path: Path, slot: int) -> None:
        """Remove a scratch directory, then free its slot; a failed removal (its error raised)
        leaves both in `leftovers`, for the sweeper. A cancel waits for the removal."""
        try:
            await in_thread(self.discard, path)
        except Exception as exc:
            log.warning("removing %s failed (tried again later): %s", path.name, exc)
            raise
        finally:
            if os.path.lexists(path):
                self.leftovers[path] = slot
            else:
                self.release_slot(slot)

    async def _retry_leftovers(self) -> None:
        for path, slot in list(self.leftovers.items()):
            del self.leftovers[path]
            with contextlib.suppress(Exception):  # logged, and back in `leftovers`
                await self.discard_scratch(path, slot)

    @contextlib.contextmanager
    def busy(self, session_id: str) -> Iterator[None]:
        """Keep the session (if it is here) from the TTL sweeper while a step of it waits or
        runs; its idle time starts again when the step ends."""
        session = self.sessions.get(session_id)
        if session is None:
            yield
            return
        session.busy += 1
        try:
            yield
        finally:
            session.busy -= 1
            session.last_used = time.monotonic()

    def _idle(self, session: Session) -> bool:
        return not session.busy and time.monotonic() - session.last_used > self.config.ttl_s

    async def close(self, session_ids: list[str]) -> int:
        """Remove these sessions (unknown ids are skipped), and retry those in `closing`
        among them; returns how many it removed. Every id is tried; then the first failure,
        if any, is raised (each is logged; its session stays in `closing`)."""
        closed, failure = await self._close(session_ids)
        if failure is not None:
            raise failure
        return closed

    async def _close(
        self, session_ids: list[str], idle: bool = False
    ) -> tuple[int, Exception | None]:
        """`close`'s work; `idle`: leave open those a step took since the sweeper listed them."""
        closed, failure = 0, None
        for session_id in session_ids:
            if idle and (open_one := self.sessions.get(session_id)) and not self._idle(open_one):
                continue
            session = self.sessions.pop(session_id, None) or self.closing.get(session_id)
            if session is None:
                continue
            self.closing[session_id] = session  # forgotten by steps; its slot still taken
            try:
                closed += await self._release(session)
            except Exception as exc:  # logged by `_remove`
                failure = failure or exc
        return closed, failure

    async def _release(self, session: Session) -> int:
        """Await the removal of a closing session, started here (1) unless one is under way
        (0: another close's, which may have been cancelled). A cancelled caller leaves it
        running: `_remove` accounts for it."""
        removal, started = session.removing, session.removing is None
        if removal is None:
            removal = session.removing = asyncio.create_task(self._remove(session))
            removal.add_done_callback(lambda done: done.cancelled() or done.exception())
        await asyncio.shield(removal)  # its error, once awaited by none, was logged
        return int(started)

    async def _remove(self, session: Session) -> None:
        """Remove a closing session's directory (a step still running finishes first), then
        free its slot; a failure is logged and leaves it in `closing`, for the next close."""
        try:
            async with session.lock:  # held until the thread ends: nothing cancels this task
                await in_thread(self.discard, session.directory)
        except Exception as exc:
            log.warning("removing session %s failed (tried again later): %s", session.id, exc)
            raise
        finally:
            session.removing = None
        del self.closing[session.id]
        self.release_slot(session.slot)

    def start_sweeper(self) -> None:
        """Start the TTL sweeper on the running loop (once)."""
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_expired())

    async def _sweep_expired(self) -> None:
        """Every SWEEP_S at most: close idle sessions, retry the removals that failed (of
        sessions and scratch directories), and remove what workers that died since this one
        started left on the host."""
        ttl = self.config.ttl_s
        while True:
            await asyncio.sleep(min(SWEEP_S, ttl / 4))
            idle = [s.id for s in self.sessions.values() if self._idle(s)]
            if idle or self.closing:
                closed, _ = await self._close([*idle, *self.closing], idle=True)  # failures: logged
                if closed:
                    log.info("closed %d sessions, idle for %.0fs or retried", closed, ttl)
            await self._retry_leftovers()
            try:
                swept = await asyncio.to_thread(sweep_dead, self.root)
            except OSError as exc:
                log.warning("removing what dead sandbox workers left failed: %s", exc)
                continue
            if swept.directories:
                log.info("removed what dead sandbox workers left: %s", swept)

    async def shutdown(self) -> None:
        """Close every session (awaiting the removals under way), retry the scratch directories
        left, and remove this worker's directory."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self.close([*self.sessions, *self.closing])
        await self._retry_leftovers()
        await asyncio.to_thread(self.discard, self.directory)
