"""Worker processes in the background, one per task queue (what `tempered train` relies on).

`ensure_workers` starts `tempered worker QUEUE` (as `python -m workers.cli worker QUEUE`) for
every queue that has no live worker of ours; `stop_workers` (called by `tempered down`) stops
them by pidfile; `background_workers` lists the live ones (`tempered status`). Workers started
any other way (a terminal, a pod) are not ours to start or stop.

A worker whose code changed since it started is restarted (its activities in flight are
retried by Temporal, as after any worker's death). The agent-tasks worker's code is
`workflows/` and `contracts/` (their digest, its build id by default): the SDK's sandbox imports
a workflow's modules afresh from disk for every run, beside the contracts the worker loaded at
its start, so an old worker would run the new workflow code against the old contracts (a new
field failed every workflow task of a run, which then waited forever). An activity worker's
code is every other package: it loads its activities once, so after an edit (a task suite, an
environment) it would go on running the old ones. A worker started with other settings (another
backend, bucket or model: `TEMPERED_*` or the TOML file) is restarted too; before, it served the
new command with the old ones, saying only "already running".
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Callable

from contracts.names import Queue
from infra.processes import Service
from infra.settings import Settings
from workers.versioning import activity_code_digest, workflow_code_digest

RESTARTED = "restarted: its code changed since it started"
RECONFIGURED = "restarted: this command's settings differ from those it started with"
PINNED = " (a run still pinned to the old build waits for a worker of that build)"


def worker_service(settings: Settings, queue: Queue) -> Service:
    return Service(f"worker-{queue.value}", settings.home)


def worker_command(queue: Queue) -> list[str]:
    return [sys.executable, "-m", "workers.cli", "worker", queue.value]


def ensure_workers(
    settings: Settings, command: Callable[[Queue], list[str]] = worker_command
) -> list[str]:
    lines = []
    env = {**os.environ, "TEMPERED_HOME": str(settings.home)}
    if settings.config is not None:  # the workers read the same TOML file as this process
        env["TEMPERED_CONFIG"] = str(settings.config)
    workflow_code, activity_code = workflow_code_digest(), activity_code_digest()
    configured = hashlib.sha256(settings.model_dump_json().encode()).hexdigest()[:16]
    for queue in Queue:
        service = worker_service(settings, queue)
        workflows = queue is Queue.AGENT_TASKS
        code = f"{workflow_code if workflows else activity_code} {configured}"
        with service.lock():
            if service.pid() is not None:
                running = service.code()
                if running in (None, code):
                    lines.append(f"worker {queue.value}: already running")
                    continue
                service.stop(timeout_s=40)
                moved = running.split()[0] != code.split()[0]  # the code, not just the settings
                why = RESTARTED + (PINNED if workflows else "") if moved else RECONFIGURED
                lines.append(f"worker {queue.value}: {why}")
            service.start(command(queue), env=env, code=code)
            lines.append(f"worker {queue.value}: started (log {service.logfile})")
    return lines


def stop_workers(settings: Settings) -> list[str]:
    return [
        f"worker {queue.value}: stopped"
        for queue in Queue
        if worker_service(settings, queue).stop(timeout_s=40)
    ]


def background_workers(settings: Settings) -> dict[Queue, int]:
    """Queue → pid of its live background worker."""
    pids = {queue: worker_service(settings, queue).pid() for queue in Queue}
    return {queue: pid for queue, pid in pids.items() if pid is not None}
