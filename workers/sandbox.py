"""Worker of the `sandbox` queue: runs model-written programs and agents' workspace sessions.

    tempered worker sandbox        # or: python -m workers.cli worker sandbox

Polls `sandbox` (execute, open_sessions, verify_episodes, and env_step/close_sessions too) and
its own queue `sandbox-<host>-<pid>` (env_step, close_sessions: the steps of the sessions it
holds; activities/environment.py). Uses `settings.sandbox.backend` (local bubblewrap by
default, gvisor, or kubernetes Jobs) for programs and checks, bubblewrap for workspace
commands, and the object store (settings.s3). Runs as root on a host with bwrap (local) or
runsc (gvisor). At start it removes what dead sandbox workers left on this host (session
directories, processes, cgroups).
"""

from __future__ import annotations

from activities.environment import EnvironmentActivities
from activities.sandbox import SandboxActivities
from infra.sandbox import get_backend
from infra.settings import Settings
from workers.plan import WorkerPlan


def build(settings: Settings) -> WorkerPlan:
    backend = get_backend(settings)
    programs = SandboxActivities(settings, backend=backend)
    sessions = EnvironmentActivities(settings, store=programs.store, backend=backend)

    async def close() -> None:
        await sessions.close()
        await programs.close()  # closes the shared backend

    return WorkerPlan(
        activities=[
            programs.execute,
            sessions.open_sessions,
            sessions.env_step,
            sessions.verify_episodes,
            sessions.close_sessions,
        ],
        max_concurrent_activities=max(4, settings.sandbox.concurrency),
        on_shutdown=close,
        own_queue=sessions.queue,
        own_queue_activities=[sessions.env_step, sessions.close_sessions],
    )
