"""Activities of workspace sessions: `open_sessions`, `env_step`, `verify_episodes`,
`close_sessions` (served by `tempered worker sandbox`, workers/sandbox.py).

Queues. Every sandbox worker polls the shared `sandbox` queue and its own queue,
`sandbox-<host>-<pid>` (`own_queue()`, Temporal's worker-specific task queue pattern):

    open_sessions    sandbox       a session per sample on THIS worker, from the task's initial
                                   tree or the given snapshots; each `SessionRef.queue` names
                                   this worker's own queue
    env_step         own queue     run each item's tool call in its session (an item brings
                                   its brief: one cut is parsed again from the turn's record),
                                   write the observation text to the store, snapshot the
                                   workspace
    close_sessions   own queue     remove sessions (best effort: a TTL reaps the rest)
    verify_episodes  sandbox       score final snapshots against the hidden tests in fresh
                                   verifier sandboxes (any worker)

Steps and checks run under the run's limits, but the task's memory, capped (`_task_limits`).

A worker that died never polls its own queue again: a step sent there ends by its
schedule-to-start timeout, and the workflow restores the sessions from their last snapshots
with `open_sessions` on `sandbox`. A session this worker no longer holds (closed, reaped by
the TTL) fails its step with the non-retryable `SessionLost`, which the workflow treats alike.
A restore names the workers that failed the step (`OpenSessionsRequest.lost_on`): one of
them that takes it (alive, but its host may be broken: a full disk, a sandbox runtime that
fails every step) declines it with the retryable `SandboxInfraError`, retried after
`DECLINED_RETRY_S` on whichever worker polls first, so that another worker restores them;
once the open has waited `lost_on_wait_s` (the task's session timeout) it opens them itself,
as a deployment of one sandbox worker needs (`_declines`). Before, any worker took it, the
broken one too, which lost them again until the task failed.
An `open_sessions` that fails or is cancelled returns no session, so the workflow never
learns of those it opened: it closes them itself (each held a uid slot and its directory until
the TTL), each on its own, and a close that fails is logged, never raised over the open's own
error or cancellation. Every activity heartbeats, so a cancel reaches it; a cancelled step
stops its sandbox command and ends (`activities/heartbeat.py`).

Errors: an agent's bad action is an observation, never an error, and a final tree that no
check can take (too large to restore or to send) scores 0; a task whose check is broken
(hidden tests too large for the verifier's scratch among them: `tests/`, once InvalidInput
blaming the agent's snapshot) is `InvalidTask` (non-retryable, naming the task and file). A script check runs the tree's own
code, which can spoil its reward file or end it before it writes one (`checks.BadReward`, a
script that leaves no reward whatever its exit): an agent's tree that does scores 0, the
reason in its verdict, and the task is broken only when its untouched tree (the initial
files: the workflow's sample G, or checked here when no item holds it) leaves no reward either
(a missing interpreter: InvalidTask, naming the task and tests/test.sh), so that an agent's
code never fails the training run. A snapshot that does not exist or
does not match its digest is `InvalidInput`, and so is a turn's record that does not match its
digest or does not give the item's call; platform and storage faults are retried, a record the
store does not hold among them (`TransientStorageError`: generate stored it before its ref came).
Observations and verdicts are written create-only under keys named by their content's digest,
so a step or a check run again (elsewhere) never changes what a returned ref names.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import timedelta
from typing import TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.heartbeat import heartbeating, heartbeating_each
from activities.sandbox import program_slots
from activities.stored import read_model
from contracts.common import ObjectRef
from contracts.episode import (
    WORKSPACE_TOOLS,
    CloseSessionsRequest,
    CloseSessionsResponse,
    EnvStepItem,
    EnvStepOutcome,
    EnvStepRequest,
    EnvStepResponse,
    OpenSessionsRequest,
    OpenSessionsResponse,
    SessionRef,
    ToolCall,
    Verdict,
    VerifyItem,
    VerifyRequest,
    VerifyResponse,
)
from contracts.errors import ErrorType, fail, invalid
from contracts.names import Activity, Queue
from contracts.rollout import CompletionRecord
from contracts.task import EnvName, SandboxLimits, WorkspaceSpec
from infra import keys
from infra.environments.base import Graded
from infra.environments.check_limits import task_limits
from infra.environments.checks import BadReward, InvalidTask
from infra.environments.sessions import Session, SessionHost
from infra.environments.snapshot_chain import episode_folder
from infra.environments.snapshots import StoreObjects, Trees
from infra.environments.tree import TreeError
from infra.environments.workspace import SessionLost, WorkspaceEnvironment, WorkspaceState
from infra.inference.toolcalls import full_call
from infra.sandbox import SandboxBackend, SandboxInfraError, get_backend
from infra.sandbox.workspace import CommandRunner
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.telemetry import record_queue_wait, record_sandbox_run, sandbox_in_flight, span

DECLINED_RETRY_S = 1.0
"""How long a restore this worker declined (it lost those sessions) waits for its retry: the
other workers' polls take it meanwhile, and the worker that declined is free at once."""
WORKSPACE_BACKEND = "workspace"
"""How telemetry names the sandbox of workspace commands (metrics `backend` label)."""
T = TypeVar("T")
R = TypeVar("R")


def own_queue(pid: int | None = None) -> str:
    """This worker process's own task queue: `sandbox-<host>-<pid>`."""
    return f"{Queue.SANDBOX.value}-{socket.gethostname()}-{os.getpid() if pid is None else pid}"


def session_id(run_id: str, task_id: str, sample: int) -> str:
    """A session's id: the sample, and a digest of the run and task (an Identifier)."""
    digest = hashlib.sha256(f"{run_id}\0{task_id}".encode()).hexdigest()[:20]
    return f"s{sample}-{digest}"


def _digest(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


class EnvironmentActivities:
    """The session activities of one sandbox worker; holds its sessions and their stores."""

    def __init__(
        self,
        settings: Settings,
        queue: str | None = None,
        store: ObjectStore | None = None,
        backend: SandboxBackend | None = None,
        slots: asyncio.Semaphore | None = None,
    ) -> None:
        """`backend` runs the `functions` checks (the worker's, shared with `execute`; closed
        here only when made here); `slots` are the worker's `program_slots`, shared with
        `execute` too (made here when not given)."""
        config = settings.sandbox.workspaces
        self.queue = queue or own_queue()
        self.store = store if store is not None else ObjectStore.from_settings(settings)
        self.trees = Trees(
            StoreObjects(self.store),
            cache_bytes=config.blob_cache_mb << 20,
            snapshot_format=config.snapshot_format,  # 1 while older workers still run
        )
        self.host = SessionHost(config)
        self._owned_backend = backend is None
        self.backend = backend if backend is not None else get_backend(settings)
        self.env = WorkspaceEnvironment(self.host, self.trees, CommandRunner(), self.backend)
        self._slots = slots if slots is not None else program_slots(settings)

    # -- the activities ----------------------------------------------------------------------

    @activity.defn(name=Activity.OPEN_SESSIONS.value)
    async def open_sessions(self, req: OpenSessionsRequest) -> OpenSessionsResponse:
        _workspace_only(req.env)
        if not req.samples:
            raise invalid("samples", "no sessions to open")
        if declined := self._declines(req):
            raise declined
        opened: dict[str, Session] = {}
        try:
            refs = await self._each(req.samples, lambda s: self._open(req, s, opened), req.task_id)
        except BaseException:  # a sample failed, or the workflow cancelled: it never learns of
            await asyncio.shield(self._close_opened(opened))  # those opened
            raise
        return OpenSessionsResponse(sessions=dict(zip(req.samples, refs, strict=True)))

    @activity.defn(name=Activity.ENV_STEP.value)
    async def env_step(self, req: EnvStepRequest) -> EnvStepResponse:
        record_queue_wait()
        _workspace_only(req.env)
        if not req.items:
            raise invalid("items", "no steps to run")
        with contextlib.ExitStack() as held:  # from here, not from a slot: the TTL sweeper
            for item in req.items:  # would close a session whose step waits for one
                held.enter_context(self.host.busy(item.session.session_id))
            outcomes = await self._each(req.items, lambda i: self._step(req, i), req.task_id)
        return EnvStepResponse(outcomes=outcomes)

    @activity.defn(name=Activity.VERIFY_EPISODES.value)
    async def verify_episodes(self, req: VerifyRequest) -> VerifyResponse:
        _workspace_only(req.env)
        if not req.items:
            raise invalid("items", "nothing to verify")
        verified = await self._each(req.items, lambda item: self._verify(req, item), req.task_id)
        if any(spoiled for _, spoiled in verified) and not any(
            _untouched(req, item.snapshot) for item in req.items
        ):  # no item is the task's own tree, which tells an agent's code from a broken check
            untouched = [req.workspace.files]
            await self._each(untouched, lambda tree: self._grade(req, tree, None), req.task_id)
        return VerifyResponse(verdicts=[verdict for verdict, _ in verified])

    @activity.defn(name=Activity.CLOSE_SESSIONS.value)
    async def close_sessions(self, req: CloseSessionsRequest) -> CloseSessionsResponse:
        return CloseSessionsResponse(closed=await heartbeating(self.env.close(req.session_ids)))

    def _declines(self, req: OpenSessionsRequest) -> ApplicationError | None:
        """The error that declines a restore of sessions whose step failed here (`req.lost_on`), for
        another worker to take, until the open has waited `req.lost_on_wait_s` since it was
        scheduled (both times the server's); None: open them here."""
        if self.queue not in req.lost_on:
            return None
        info = activity.info()
        waited = (info.current_attempt_scheduled_time - info.scheduled_time).total_seconds()
        if waited >= req.lost_on_wait_s:
            activity.logger.warning(
                "restoring the sessions of task %s here, where they were lost: no other sandbox "
                "worker took them in %.0f s",
                req.task_id,
                waited,
            )
            return None
        return fail(
            ErrorType.SANDBOX_INFRA,
            f"task {req.task_id}: sandbox worker {self.queue} failed these sessions' step; another "
            f"worker should restore them (retried in {DECLINED_RETRY_S:.0f} s on whichever "
            f"takes it; this one opens them after {req.lost_on_wait_s:.0f} s)",
            next_retry_delay=timedelta(seconds=DECLINED_RETRY_S),
        )

    # -- one item each -----------------------------------------------------------------------

    async def _open(
        self, req: OpenSessionsRequest, sample: int, opened: dict[str, Session]
    ) -> SessionRef:
        """Open one sample's session and note it in `opened` (a reset that does not end
        closes what it made itself)."""
        snapshot = req.snapshots.get(sample)
        where = f"snapshots[{sample}]" if snapshot else "workspace.files"
        with _faults(where):
            state = await self.env.reset(
                req.workspace, session_id(req.run_id, req.task_id, sample), snapshot
            )
        opened[state.session_id] = self.host.sessions[state.session_id]
        return self._ref(state)

    async def _close_opened(self, opened: dict[str, Session]) -> None:
        """Close the sessions an open made but does not return, each on its own; one that a
        later attempt of the open replaced is that attempt's, and stays. A close that fails
        is logged, never raised over the open's own error or cancellation."""
        for sid, session in list(opened.items()):
            if self.host.sessions.get(sid) is not session:
                continue
            try:
                await self.env.close([sid])
            except Exception:
                activity.logger.warning("closing session %s failed", sid, exc_info=True)

    async def _step(self, req: EnvStepRequest, item: EnvStepItem) -> EnvStepOutcome:
        session = item.session
        state = WorkspaceState(session.session_id, session.snapshot, session.tree_digest)
        call = await self._call(item)
        tool = item.call.name if item.call.error is None else "malformed"
        with (
            _faults(f"sample {item.sample}: session.snapshot"),
            span(
                "sandbox.env_step",
                task_id=req.task_id,
                sample=item.sample,
                turn=req.step,
                tool=tool,
            ),
            sandbox_in_flight(WORKSPACE_BACKEND),
            episode_folder(req.run_id, req.task_id, item.sample),  # retention deletes it
        ):
            started = time.perf_counter()
            try:
                after, seen = await self.env.step(state, call, self._limits(req, item), req.step)
            except SessionLost as exc:
                raise fail(ErrorType.SESSION_LOST, f"sample {item.sample}: {exc}") from exc
        if seen.status is not None:
            record_sandbox_run(WORKSPACE_BACKEND, seen.status.value, time.perf_counter() - started)
        key = keys.observation_key(
            req.run_id, req.task_id, item.sample, req.step, _digest(seen.text)
        )
        observation = await asyncio.to_thread(self.store.put_text, key, seen.text, create_only=True)
        return EnvStepOutcome(
            sample=item.sample,
            call=item.call,
            observation=observation,
            status=seen.status,
            submitted=seen.submitted,
            session=self._ref(after),
        )

    def _limits(self, req: EnvStepRequest, item: EnvStepItem) -> SandboxLimits:
        """The run's limits, but the memory the task of the item's session states (a session
        not here fails its step: `SessionLost`)."""
        session = self.host.sessions.get(item.session.session_id)
        return req.limits if session is None else self._task_limits(req, session.spec)

    def _task_limits(
        self, req: EnvStepRequest | VerifyRequest, spec: WorkspaceSpec
    ) -> SandboxLimits:
        return task_limits(spec, req.limits, self.host.config.max_task_memory_mb, req.task_id)

    async def _call(self, item: EnvStepItem) -> ToolCall:
        """The call to run: the item's own, or where that brief was cut, the whole call parsed
        again from the turn's record. A record the store does not hold is retried (it was
        stored before the ref came); one that does not give that call can never run."""
        if not item.call.cut:
            return item.call
        ref, where = item.completion, f"items[sample {item.sample}].completion"
        record = await asyncio.to_thread(
            read_model, self.store, where, ref, CompletionRecord, missing_retried=True
        )
        try:
            return full_call(item.call, record.text, WORKSPACE_TOOLS, thinking=record.thinking)
        except ValueError as exc:
            raise invalid(where, f"{ref.key}: {exc}") from exc

    async def _verify(self, req: VerifyRequest, item: VerifyItem) -> tuple[Verdict, bool]:
        """The item's verdict, and whether its tree spoiled the reward file (scored 0)."""
        graded, spoiled = await self._grade(req, item.snapshot, item.sample)
        result = graded.result
        data = result.model_dump_json()
        key = keys.verdict_key(req.run_id, req.task_id, item.sample, _digest(data))
        ref = await asyncio.to_thread(self.store.put_json, key, result, create_only=True)
        verdict = Verdict(
            sample=item.sample,
            status=result.status,
            tests_passed=result.tests_passed,
            tests_total=result.tests_total,
            score=graded.score,
            result=ref,
        )
        return verdict, spoiled

    async def _grade(
        self, req: VerifyRequest, tree: ObjectRef, sample: int | None
    ) -> tuple[Graded, bool]:
        """The tree's score (`sample` None: the task's initial tree), and whether the tree
        spoiled the script's reward file: scored 0 for an agent's tree, the task broken for its
        own. A broken check is `InvalidTask`."""
        where = "workspace.files" if sample is None else f"items[sample {sample}].snapshot"
        state = WorkspaceState("verify-untouched" if sample is None else f"verify-s{sample}", tree)
        with _faults(where):
            try:
                limits = self._task_limits(req, req.workspace)  # the task's memory, capped
                return await self.env.verify(req.workspace, state, limits), False
            except BadReward as exc:  # the agent's code spoiled it, unless the tree is the task's
                if exc.graded is None or _untouched(req, tree):
                    raise fail(ErrorType.INVALID_TASK, f"task {req.task_id}: {exc}") from exc
                return exc.graded, True
            except InvalidTask as exc:
                raise fail(ErrorType.INVALID_TASK, f"task {req.task_id}: {exc}") from exc

    def _ref(self, state: WorkspaceState) -> SessionRef:
        return SessionRef(
            session_id=state.session_id,
            queue=self.queue,
            snapshot=state.snapshot,
            tree_digest=state.tree_digest,
        )

    async def _each(
        self, items: Sequence[T], work: Callable[[T], Awaitable[R]], what: str
    ) -> list[R]:
        """`work` on every item concurrently, each holding one of the worker's program slots
        (`sandbox.concurrency`, shared with `execute`'s programs), heartbeating; the first
        failure cancels the rest and is raised as it is."""

        async def bounded(item: T) -> R:
            async with self._slots:
                return await work(item)

        return await heartbeating_each(items, bounded, details=lambda: what)

    async def close(self) -> None:
        await self.host.shutdown()
        self.trees.close()
        if self._owned_backend:
            await self.backend.close()


def _untouched(req: VerifyRequest, tree: ObjectRef) -> bool:
    """Whether `tree` is the task's initial tree (the same bytes: an agent's tree that changed
    nothing is the task's own too)."""
    return tree.sha256 == req.workspace.files.sha256


def _workspace_only(env: EnvName) -> None:
    if env is not EnvName.WORKSPACE:
        raise invalid("env", f"{env.value} tasks have no sessions (only workspace tasks do)")


@contextlib.contextmanager
def _faults(where: str) -> Iterator[None]:
    """Turn an item's platform and tree faults into the activity's typed errors."""
    try:
        yield
    except SandboxInfraError as exc:
        raise fail(ErrorType.SANDBOX_INFRA, f"{where}: {exc}") from exc
    except TreeError as exc:
        raise invalid(where, str(exc)) from exc
