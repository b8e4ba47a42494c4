"""Worker of the `sandbox` queue: runs model-written programs and agents' workspace sessions.

    tempered worker sandbox        # or: python -m workers.cli worker sandbox

Polls `sandbox` (execute, open_sessions, verify_episodes, and env_step/close_sessions too) and
its own queue `sandbox-<host>-<pid>` (env_step, close_sessions: the steps of the sessions it
holds; activities/environment.py). Uses `settings.sandbox.backend` (local bubblewrap by
default, gvisor, or kubernetes Jobs) for programs and checks, bubblewrap for workspace
commands, and the object store (settings.s3). Runs as root on a host with bwrap (local) or
runsc (gvisor). At start it removes what dead sandbox workers left on this host (session
directories, processes, cgroups).

Workspace commands always run in bubblewrap on this worker's host, whatever the backend: a
worker whose host has no bwrap (the Helm chart's pods, which run programs as Kubernetes Jobs),
or whose bwrap cannot create its namespaces (unprivileged user namespaces disabled, a seccomp
profile, a container without the capabilities: `infra/sandbox/probe.py` starts one step's
sandbox for `true`, in a session slot's uid, cgroups and workspace directory, ~20 ms), says so
in one line at start (bwrap's own error) and refuses every `open_sessions` with the
non-retryable `SandboxMisconfigured`, so a workspace task fails at once with what to fix
instead of failing each step with a platform fault that is retried for ever. Its programs and
checks run as usual. Only an error no retry mends refuses sessions: a resource shortage at
start (user namespaces, pids or memory used up by neighbours' sessions for a moment), a probe
that gets no answer (a loaded host) or an error of no known kind refuses nothing, since
`open_sessions` runs on the shared `sandbox` queue and a refusing worker fails, for good, every
task whose open lands on it.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable

from temporalio import activity

from activities.environment import EnvironmentActivities
from activities.sandbox import SandboxActivities
from contracts.episode import OpenSessionsRequest, OpenSessionsResponse
from contracts.errors import ErrorType, fail
from contracts.names import Activity
from infra.environments.sessions import SessionHost
from infra.sandbox import get_backend
from infra.sandbox.workspace import CommandRunner
from infra.settings import Settings
from workers.plan import WorkerPlan

log = logging.getLogger("tempered.worker")


def build(settings: Settings) -> WorkerPlan:
    backend = get_backend(settings)
    programs = SandboxActivities(settings, backend=backend)
    sessions = EnvironmentActivities(settings, store=programs.store, backend=backend)
    open_sessions: Callable[..., Awaitable[OpenSessionsResponse]] = sessions.open_sessions
    if unusable := probe_sessions(sessions.env.runner, sessions.host):
        log.warning("sandbox worker: no workspace sessions on this worker: %s", unusable)
        open_sessions = refuse_sessions(unusable)

    async def close() -> None:
        await sessions.close()
        await programs.close()  # closes the shared backend

    return WorkerPlan(
        activities=[
            programs.execute,
            open_sessions,
            sessions.env_step,
            sessions.verify_episodes,
            sessions.close_sessions,
        ],
        max_concurrent_activities=max(4, settings.sandbox.concurrency),
        on_shutdown=close,
        own_queue=sessions.queue,
        own_queue_activities=[sessions.env_step, sessions.close_sessions],
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
    """An `open_sessions` that fails every request, not retried: this worker cannot run a
    workspace command (`unusable` says why), on this attempt or any other."""
    why = (
        f"sandbox worker {socket.gethostname()} cannot run workspace sessions: {unusable}. "
        "Workspace tasks need sandbox workers whose own host runs bubblewrap sandboxes (the "
        "kubernetes backend runs programs as Jobs, not workspace sessions); run them with "
        "`tempered worker sandbox` on such a host"
    )

    @activity.defn(name=Activity.OPEN_SESSIONS.value)
    async def open_sessions(req: OpenSessionsRequest) -> OpenSessionsResponse:
        raise fail(ErrorType.SANDBOX_MISCONFIGURED, f"task {req.task_id}: {why}")

    return open_sessions
