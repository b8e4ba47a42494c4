"""The `workspace` environment: a directory the agent works in through tools.

    env = WorkspaceEnvironment(host, trees, CommandRunner(), backend)
    state = await env.reset(task.workspace, "s0-1a2b")            # restore the initial tree
    state, seen = await env.step(state, ToolCall(name="bash", arguments={"command": "ls"}), limits)
    graded = await env.verify(task.workspace, state, limits)      # hidden tests, fresh sandbox

Tools (`contracts.episode.WORKSPACE_TOOLS`; a call's arguments are checked by `tools.py`):

- `bash`: `/bin/sh -c command` in a fresh sandbox over the workspace, mounted read-write at the
  task's workdir (`infra/sandbox/workspace.py`: own uid and cgroups, no network, wall-time,
  CPU, output, file-size, process and memory limits). The observation is the exit code and
  what it printed.
- `read_file`, `write_file`: done by the host in the workspace directory, as the session's uid,
  reaching nothing a link leads out to (`file_tools.py`).
- `submit`: ends the episode; the workspace as it is is graded at DONE.

A malformed call, an unknown tool, bad arguments or a path out of the workspace give an error
observation (a step like any other). After every step the workspace root is put back to its
mode (no tree holds it: `Session.reset_root_mode`) and the workspace is snapshotted
(`snapshots.py`: only changed files uploaded); the new state names the snapshot and the tree
digest. What no snapshot can hold (a FIFO, a name that is not UTF-8: `walk.py`) is removed
after the step and named in its observation, so a session restored after a crash is the
workspace the agent saw. A step runs from the state it is given: a session holding another
tree (a retried step whose first attempt got further) is restored from that state's snapshot
first, and so is one that already ran a step of that number or a later one (a retry whose
first attempt changed only what no snapshot holds, such as a directory's times; before, the
retry repeated it).

A workspace is a tmpfs of its own where the worker may mount one (`mounts.py`): past the quota
a command gets ENOSPC, and `write_file` an error observation. A cancelled reset or step holds
its session's lock until its thread has ended (`in_thread`); a step that waited while its
session was closed is lost.

Not covered: interactive commands (stdin is empty), output streamed while a command runs, a
quota inside one command where no tmpfs can be mounted (the size is checked after it).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from contracts.common import ObjectRef
from contracts.episode import WORKSPACE_TOOLS, ToolCall, ToolSpec
from contracts.task import EnvName, SandboxLimits, WorkspaceSpec
from infra.environments.base import Graded, Observation
from infra.environments.checks import InvalidTask, check_functions, check_script, unchecked
from infra.environments.disk import restore
from infra.environments.file_tools import read_file, write_file
from infra.environments.paths import AGENT_ERRNOS, PathError
from infra.environments.sessions import Session, SessionHost
from infra.environments.snapshots import Trees
from infra.environments.threads import in_thread
from infra.environments.tools import TOOLS, bad_arguments, command_text
from infra.environments.tree import Manifest, TreeError
from infra.sandbox.base import SandboxBackend
from infra.sandbox.workspace import CommandRunner, Mounts, cgroup_name, session_uid

SOLUTION_DIR, SOLVE = "/solution", "solve.sh"
"""Where Harbor's oracle finds the reference solution, and what it runs."""
UNKEPT_NAMED = 8
"""Paths a step's note names of what it removed (`walk.py`); more are an ellipsis."""
UNKEPT_WHY = "a workspace keeps only directories, regular files and links, with UTF-8 names"


class SessionLost(LookupError):
    """The session is not on this worker (it was closed, reaped by its TTL, or never here)."""


@dataclass(frozen=True)
class WorkspaceState:
    """Where an episode's workspace is and its last durable state."""

    session_id: str
    snapshot: ObjectRef
    tree_digest: str = ""


class WorkspaceEnvironment:
    """Sessions of `workspace` episodes on this worker, and their verification."""

    name = EnvName.WORKSPACE
    tools: tuple[ToolSpec, ...] = WORKSPACE_TOOLS
    _read, _write = staticmethod(read_file), staticmethod(write_file)
    """The file tools (`file_tools.py`), each run in a thread of its own."""

    def __init__(
        self, host: SessionHost, trees: Trees, runner: CommandRunner, backend: SandboxBackend
    ) -> None:
        self.host, self.trees, self.runner, self.backend = host, trees, runner, backend
        self._agent_errnos = AGENT_ERRNOS | ({errno.ENOSPC} if host.tmpfs else set())
        """What a file tool's OSError may be that the agent caused: with a tmpfs a full disk
        is its own workspace's (without one, the host's)."""

    # -- reset and close ---------------------------------------------------------------------

    async def reset(
        self, task: WorkspaceSpec, session_id: str, snapshot: ObjectRef | None = None
    ) -> WorkspaceState:
        """A session holding `snapshot` (default: the task's initial tree). An existing session
        of that id on this worker (a retried open) is replaced."""
        await self.host.close([session_id])
        session = self.host.create(session_id, task)
        try:  # a close after a cancel waits for the restore's thread
            with self.host.busy(session_id):
                async with session.lock:
                    await self._restore(session, snapshot or task.files)
        except BaseException:
            await self.host.close([session_id])
            raise
        return self._state(session)

    async def close(self, session_ids: Sequence[str]) -> int:
        return await self.host.close(list(session_ids))

    async def _restore(self, session: Session, snapshot: ObjectRef) -> None:
        """Make the session's workspace exactly the tree `snapshot` names (under its lock)."""
        manifest = await in_thread(self.trees.get_manifest, snapshot)
        contents = await in_thread(self.trees.get_contents, manifest)

        def write() -> None:
            self.host.empty(session)
            uid = session.uid if os.geteuid() == 0 else None
            self._restore_into(session.workspace, manifest, contents, uid)
            session.scanner.prime(session.workspace, manifest)

        session.snapshot = session.manifest = None  # until it is all written
        await in_thread(write)
        session.snapshot, session.manifest = snapshot, manifest

    def _restore_into(
        self, root: Path, manifest: Manifest, contents: dict[str, bytes], uid: int | None
    ) -> None:
        """`restore`, where a tree too large for its tmpfs (a task's own: a step's scan counts
        what its restore takes) is the task's fault, not the platform's."""
        try:
            restore(manifest, contents, root, uid)
        except OSError as exc:
            if exc.errno != errno.ENOSPC or not self.host.tmpfs:
                raise
            mb = self.host.config.max_workspace_mb
            raise TreeError(f"the tree does not fit a workspace's {mb} MB") from exc

    def _restore_task_tree(
        self, root: Path, manifest: Manifest, contents: dict[str, bytes], name: str
    ) -> None:
        """A task's own tree (tests, solution) into a scratch; too large, the task's fault
        (InvalidTask naming it: once InvalidInput blaming the agent's snapshot)."""
        try:
            self._restore_into(root, manifest, contents, None)
        except TreeError as exc:
            mb = self.host.config.max_workspace_mb
            why = f"a workspace's {mb} MB (sandbox.workspaces.max_workspace_mb)"
            raise InvalidTask(
                f"{name}/ does not fit the scratch it is restored into, {why}"
            ) from exc

    def _state(self, session: Session) -> WorkspaceState:
        assert session.snapshot is not None and session.manifest is not None
        return WorkspaceState(session.id, session.snapshot, session.manifest.digest())

    # -- step --------------------------------------------------------------------------------

    async def step(
        self, state: WorkspaceState, action: ToolCall, limits: SandboxLimits,
        number: int | None = None,
    ) -> tuple[WorkspaceState, Observation]:  # fmt: skip
        """Run one tool call from `state`; raises SessionLost if the session is not here.
        `number`: the step's in its episode (`EnvStepRequest.step`), a retry's the same."""
        changes = action.error is None and action.name in ("bash", "write_file")
        async with self._from(state, number if changes else None) as session:
            observation = await self._act(session, action, limits)
            if changes:
                observation = await self._snapshot(session, observation)
            return self._state(session), observation

    @contextlib.asynccontextmanager
    async def _from(
        self, state: WorkspaceState, number: int | None = None
    ) -> AsyncIterator[Session]:
        """The session, busy (`SessionHost.busy`) and locked, holding the tree `state` names:
        restored first if it holds another (a retried step whose first attempt got further) or
        if it applied a step `number` or later (a retry), and noted as applying `number`.
        An error or a cancel inside leaves it to be restored by the next step. SessionLost if
        it is not here, or was closed while this waited for its lock (a new session may be at
        its path)."""
        session_id = state.session_id
        lost = SessionLost(f"session {session_id} is not on this worker")
        with self.host.busy(session_id):
            if (session := self.host.sessions.get(session_id)) is None:
                raise lost
            async with session.lock:
                if self.host.sessions.get(session_id) is not session:
                    raise lost
                held = session.snapshot
                retried = number is not None and number <= session.applied
                if retried or held is None or held.sha256 != state.snapshot.sha256:
                    await self._restore(session, state.snapshot)
                if number is not None:
                    session.applied = number
                try:
                    yield session
                except BaseException:
                    session.snapshot = session.manifest = None  # not durable: restore next time
                    raise

    async def _snapshot(self, session: Session, observation: Observation) -> Observation:
        """Store the workspace after a step that may have changed it; a workspace grown past
        its size limit is put back as it was, and the agent is told. What no snapshot can keep
        (a FIFO, a name that is not UTF-8) is removed, so a crash changes nothing the agent
        sees, and the agent is told that too."""
        previous = session.manifest
        assert session.snapshot is not None and previous is not None

        def scan_and_store() -> TreeError | tuple[ObjectRef, Manifest] | None:
            """One trip to a thread: the scan (its TreeError returned: the step is undone), then
            the commit if the tree changed."""
            scanner = session.scanner
            session.reset_root_mode()
            try:
                entries, new = scanner.scan(session.workspace, previous.packed(), prune=True)
            except TreeError as exc:
                return exc
            if previous.holds(entries, scanner.mtimes):
                return None
            return self.trees.commit(entries, new, previous, mtimes=scanner.mtimes)

        stored = await in_thread(scan_and_store)
        if isinstance(stored, TreeError):
            await self._restore(session, session.snapshot)
            text = f"{observation.text}\nerror: {stored}; the step's changes were undone"
            return Observation(text, observation.status, observation.submitted)
        if stored is not None:
            session.snapshot, session.manifest = stored
        if unkept := session.scanner.unkept:
            named = ", ".join(unkept[:UNKEPT_NAMED]) + (
                ", ..." if len(unkept) > UNKEPT_NAMED else ""
            )
            text = f"{observation.text}\nnote: removed {named}: {UNKEPT_WHY}"
            return Observation(text, observation.status, observation.submitted)
        return observation

    async def _act(self, session: Session, call: ToolCall, limits: SandboxLimits) -> Observation:
        if call.error is not None:
            return Observation(f"error: {call.error}")
        tool = TOOLS.get(call.name)
        if tool is None:
            return Observation(
                f"error: there is no tool {call.name!r}; the tools are {', '.join(TOOLS)}"
            )
        if problem := bad_arguments(tool, call.arguments):
            return Observation(f"error: {problem}")
        arguments = {name: str(value) for name, value in call.arguments.items()}
        try:
            match call.name:
                case "bash":
                    return await self._bash(session, arguments["command"], limits)
                case "read_file":
                    return await in_thread(self._read, session, arguments["path"], limits)
                case "write_file":
                    return await in_thread(
                        self._write, session, arguments["path"], arguments["content"], limits
                    )
                case "submit":
                    text = "submitted: the workspace will be graded as it is now"
                    return Observation(text, submitted=True)
        except PathError as exc:
            return Observation(f"error: {exc}")
        except OSError as exc:  # e.g. a name too long: once retried forever as a platform fault
            if exc.errno not in self._agent_errnos or "path" not in arguments:
                raise  # the platform's (bash's errors are its sandbox's: no path of the agent's)
            return Observation(f"error: {arguments['path']}: {exc.strerror}")
        raise AssertionError(f"tool {call.name} has no implementation")

    async def _bash(
        self, session: Session, command: str, limits: SandboxLimits,
        extra: tuple[tuple[Path, str, bool], ...] = (),
    ) -> Observation:  # fmt: skip
        spec = session.spec
        mounts = Mounts(session.workspace, spec.workdir, extra=extra, env=spec.env_vars)
        name = cgroup_name(session.slot)
        result = await self.runner.run(command, mounts, session.uid, limits, name)
        return Observation(command_text(result, limits.output_bytes), result.status)

    async def solve(
        self, state: WorkspaceState, solution: ObjectRef, limits: SandboxLimits
    ) -> tuple[WorkspaceState, Observation]:
        """Harbor's oracle, for `tempered tasks validate`: `bash /solution/solve.sh` in the
        workspace, with the task's reference solution tree read-only at /solution; run from
        `state` as a step is. A solution too large for its scratch is InvalidTask."""
        manifest = await asyncio.to_thread(self.trees.get_manifest, solution)
        contents = await asyncio.to_thread(self.trees.get_contents, manifest)
        async with self.host.scratch() as (scratch, _):
            await in_thread(self._restore_task_tree, scratch, manifest, contents, "solution")
            async with self._from(state) as session:
                command = f"bash {SOLUTION_DIR}/{SOLVE}"
                seen = await self._bash(session, command, limits, ((scratch, SOLUTION_DIR, False),))
                seen = await self._snapshot(session, seen)
                return self._state(session), seen

    # -- verify ------------------------------------------------------------------------------

    async def verify(
        self, task: WorkspaceSpec, state: WorkspaceState, limits: SandboxLimits
    ) -> Graded:
        """Score the tree `state.snapshot` names with the task's hidden tests, in a fresh
        verifier sandbox (the session, if any, is not touched); hidden tests too large for its
        scratch are InvalidTask, a final tree too large for its own scores 0."""
        workspace = await asyncio.to_thread(self.trees.get_manifest, state.snapshot)
        tests = await asyncio.to_thread(self.trees.get_manifest, task.verifier)
        check = tests.check
        if check is None:
            raise InvalidTask("the hidden tests say nothing about how they are checked")
        contents = await asyncio.to_thread(self.trees.get_contents, workspace)
        test_contents = await asyncio.to_thread(self.trees.get_contents, tests)
        if check.kind == "functions":
            entry = next((e for e in tests.files() if e.path == check.tests), None)
            if entry is None:
                raise InvalidTask(f"the hidden tests hold no {check.tests}")
            source = test_contents[entry.sha256].decode()
            return await check_functions(self.backend, workspace, contents, check, source, limits)
        async with self.host.scratch() as (scratch, slot):  # the slot freed once it is gone
            uid = session_uid(slot) if os.geteuid() == 0 else None

            def lay_out() -> TreeError | None:
                """Both trees; a final workspace that does not fit its quota (stored before the
                scan counted what a restore takes) is returned, to be scored."""
                (scratch / "tests").mkdir(mode=0o755)  # too large: the task's (InvalidTask)
                self._restore_task_tree(scratch / "tests", tests, test_contents, "tests")
                (scratch / "ws").mkdir(mode=0o755)  # a quota of its own: a Harbor test script
                self.host.quota(scratch / "ws", uid or os.geteuid(), 0o755)  # runs agent code
                try:
                    self._restore_into(scratch / "ws", workspace, contents, uid)
                except TreeError as exc:
                    return exc
                return None

            if unfit := await in_thread(lay_out):  # the agent's tree: scored, not failed
                return unchecked(f"the final workspace cannot be checked: {unfit}", limits)
            return await check_script(
                self.runner, scratch, task, check, uid or os.geteuid(), limits, cgroup_name(slot)
            )
