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
profile, a container without the capabilities: `CommandRunner.probe` starts one step's sandbox
for `true`, ~20 ms), says so in one line at start (bwrap's own error) and refuses every
`open_sessions` with the non-retryable `SandboxMisconfigured`, so a workspace task fails at
once with what to fix instead of failing each step with a platform fault that is retried for
ever. Its programs and checks run as usual. A probe that gets no answer (a loaded host) refuses
nothing.
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
from infra.sandbox import get_backend
from infra.settings import Settings
from workers.plan import WorkerPlan

log = logging.getLogger("tempered.worker")


def build(settings: Settings) -> WorkerPlan:
    backend = get_backend(settings)
    programs = SandboxActivities(settings, backend=backend)
    sessions = EnvironmentActivities(settings, store=programs.store, backend=backend)
    open_sessions: Callable[..., Awaitable[OpenSessionsResponse]] = sessions.open_sessions
    if unusable := sessions.env.runner.probe():
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
