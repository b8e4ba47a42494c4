"""Worker of the `sandbox` queue: runs model-written programs and agents' workspace sessions.

    tempered worker sandbox        # or: python -m workers.cli worker sandbox

Polls `sandbox` (execute, open_sessions, verify_episodes, and env_step/close_sessions too) and
its own queue `sandbox-<host>-<pid>` (env_step, close_sessions: the steps of the sessions it
holds; activities/environment.py). Uses `settings.sandbox.backend` (local bubblewrap by
default, gvisor, or kubernetes Jobs) for programs and checks, bubblewrap for workspace
commands, and the object store (settings.s3). Its programs, checks, workspace steps and
session opens take their slots from one limit of `settings.sandbox.concurrency` for the whole
worker (`activities.sandbox.program_slots`). Runs as root on a host with bwrap (local) or
runsc (gvisor). At start it removes what dead sandbox workers left on this host (session
directories, processes, cgroups).

Workspace commands always run in bubblewrap on this worker's host, whatever the backend: a
worker whose host has no bwrap, or whose bwrap cannot create its namespaces (the Helm chart's
pods without `sandbox.workspaceSessions`, uid 10001 without capabilities, which run programs as
Kubernetes Jobs; unprivileged user namespaces disabled, a seccomp profile:
`infra/sandbox/probe.py` starts one step's sandbox for `true`, in a session slot's uid, cgroups
and workspace directory, ~20 ms), says so in one line at start (bwrap's own error) and refuses
every `open_sessions` with the retryable `SessionsUnavailable`, retried after `REFUSED_RETRY_S`,
instead of opening sessions whose every step fails with a platform fault. Its programs and
checks run as usual. The refusal is retried because `open_sessions` runs on the shared
`sandbox` queue: one bad host among good ones failed, for good (`SandboxMisconfigured`, not
retried), each task whose open it took, and with it the training run. The retry waits: a
worker that refuses at once is always free, and would take the retry again and again. Where no
sandbox worker can run sessions, a workspace task's open is retried, each attempt's failure
saying what to fix, until its refusals have lasted `REFUSED_FOR_S`; then it fails for good
(`SandboxMisconfigured`, and with it the run), rather than wait for ever with nothing but a
pending activity to show it (the chart's default has no workspace sessions). Only an error no retry mends refuses sessions: a
resource shortage at start (user namespaces, pids or memory used up by neighbours' sessions for
a moment), a probe that gets no answer (a loaded host) or an error of no known kind refuses
nothing.

With the gvisor backend, a worker whose runsc runs no container (a platform it does not know,
containers that never come up: `GVisorBackend.probe`, one container at start) says so too and
refuses `execute` alike, retried later on whichever worker takes it, for `REFUSED_FOR_S` too.

Not here: a worker that stops polling `sandbox` when it cannot run sessions (it would run no
program either, and the chart's session-less pods are meant to run them).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable
from datetime import timedelta

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.environment import EnvironmentActivities
from activities.sandbox import SandboxActivities, program_slots
from contracts.episode import OpenSessionsRequest, OpenSessionsResponse
from contracts.errors import ErrorType, fail
from contracts.names import Activity
from contracts.sandbox import ExecuteRequest, ExecuteResponse
from infra.environments.sessions import SessionHost
from infra.sandbox import get_backend
from infra.sandbox.gvisor import GVisorBackend
from infra.sandbox.workspace import CommandRunner
from infra.settings import Settings
from workers.plan import WorkerPlan, close_each

log = logging.getLogger("tempered.worker")
REFUSED_RETRY_S = 120.0
"""How long an `open_sessions` this worker refused waits before its retry: long beside an open
(under a second), so the retries of a task that keeps landing here cost little, and short
beside a training run."""
REFUSED_FOR_S = 30 * 60.0
"""How long the refusals of one `open_sessions` (or `execute`) last before the last one is final
(since its first attempt was scheduled): by then no worker of the queue could serve it, long beside a
rolling restart's bad host, and a run that waits longer only hides the fault."""


def build(settings: Settings) -> WorkerPlan:
    backend = get_backend(settings)
    slots = program_slots(settings)  # one limit for the programs of both classes
    programs = SandboxActivities(settings, backend=backend, slots=slots)
    sessions = EnvironmentActivities(settings, store=programs.store, backend=backend, slots=slots)
    open_sessions: Callable[..., Awaitable[OpenSessionsResponse]] = sessions.open_sessions
    if unusable := probe_sessions(sessions.env.runner, sessions.host):
        log.warning("sandbox worker: no workspace sessions on this worker: %s", unusable)
        open_sessions = refuse_sessions(unusable)
    execute: Callable[..., Awaitable[ExecuteResponse]] = programs.execute
    if isinstance(backend, GVisorBackend) and (broken := backend.probe()):
        log.warning("sandbox worker: no programs on this worker: %s", broken)
        execute = refuse_programs(broken)

    async def close() -> None:
        await close_each(
            [
                ("closing the workspace sessions", sessions.close),
                ("closing the programs' backend", programs.close),  # the shared backend
            ]
        )

    return WorkerPlan(
        activities=[
            execute,
            open_sessions,
            sessions.env_step,
            sessions.verify_episodes,
            sessions.close_sessions,
        ],
        max_concurrent_activities=max(4, settings.sandbox.concurrency),
        on_shutdown=close,
        own_queue=sessions.queue,
        own_queue_activities=[sessions.env_step, sessions.close_sessions],
        uses_store=True,
    )


def probe_sessions(runner: CommandRunner, host: SessionHost) -> str:
    """Why this worker can run no workspace session ("" when it can, or no verdict): the probe
    of `runner`'s sandbox, in a slot of `host` and a workspace in its directory, as a session's
    (`infra/sandbox/probe.py`)."""
    slot = host.take_slot()
    try:
        return runner.probe(host.directory, slot)
    finally:
        host.release_slot(slot)


def refuse_sessions(unusable: str) -> Callable[..., Awaitable[OpenSessionsResponse]]:
    """An `open_sessions` that fails every request (`refusal`): this worker cannot run a
    workspace command (`unusable` says why), on this attempt or any other."""

    @activity.defn(name=Activity.OPEN_SESSIONS.value)
    async def open_sessions(req: OpenSessionsRequest) -> OpenSessionsResponse:
        raise refusal(
            req.task_id,
            "workspace sessions",
            unusable,
            ErrorType.SESSIONS_UNAVAILABLE,
            advice="Workspace tasks need sandbox workers whose own host runs bubblewrap "
            "sandboxes (the kubernetes backend runs programs as Jobs, not workspace sessions); "
            "run them with `tempered worker sandbox` on such a host.",
            final="Run sandbox workers whose own host runs bubblewrap sandboxes (`tempered "
            "worker sandbox` on such a host; in the Helm chart, sandbox.workspaceSessions)",
        )

    return open_sessions


def refuse_programs(broken: str) -> Callable[..., Awaitable[ExecuteResponse]]:
    """An `execute` that fails every request (`refusal`), as `refuse_sessions` does: this
    worker's runsc runs no container (`broken` is runsc's own error: a platform it does not
    know, containers that never come up), on this attempt or any other."""

    @activity.defn(name=Activity.EXECUTE.value)
    async def execute(req: ExecuteRequest) -> ExecuteResponse:
        raise refusal(
            req.task_id,
            "programs",
            broken,
            ErrorType.SANDBOX_INFRA,
            advice="Fix the gVisor settings (sandbox.gvisor.platform) or the host's runsc.",
            final="Fix the gVisor settings (sandbox.gvisor.platform) or the hosts' runsc",
        )

    return execute


def refusal(
    task_id: str, work: str, why: str, kind: ErrorType, *, advice: str, final: str
) -> ApplicationError:
    """A refused request of `task_id`: `kind`, retried after `REFUSED_RETRY_S` on whichever
    worker takes it, saying why (`why`) and what to do (`advice`); once `refused_too_long`, the
    non-retryable `SANDBOX_MISCONFIGURED` (no worker could run that `work`; `final` says what
    to fix)."""
    if refused_too_long():
        return fail(
            ErrorType.SANDBOX_MISCONFIGURED,
            f"task {task_id}: no sandbox worker could run {work} for {REFUSED_FOR_S / 60:.0f} "
            f"min; the last: {why}. {final}",
        )
    return fail(
        kind,
        f"task {task_id}: sandbox worker {socket.gethostname()} cannot run {work}: {why}. "
        f"{advice} Retried in {REFUSED_RETRY_S:.0f} s, on whichever sandbox worker takes it",
        next_retry_delay=timedelta(seconds=REFUSED_RETRY_S),
    )


def refused_too_long() -> bool:
    """Whether the refusals of the running activity have lasted `REFUSED_FOR_S`: the time since
    its first attempt was scheduled (both times the server's), not its attempts: other refusals
    come sooner than `REFUSED_RETRY_S` apart (a restore its broken worker declines is retried
    after a second, `activities.environment.DECLINED_RETRY_S`)."""
    info = activity.info()
    return (info.current_attempt_scheduled_time - info.scheduled_time).total_seconds() >= (
        REFUSED_FOR_S
    )
