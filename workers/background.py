"""Worker processes in the background, one per task queue (what `tempered train` relies on).

`ensure_workers` starts `tempered worker QUEUE` (as `python -m workers.cli worker QUEUE`) for
every queue that has no live worker of ours; `stop_workers` (called by `tempered down`) stops
them by pidfile; `background_workers` lists the live ones (`tempered status`). Workers started
any other way (a terminal, a pod) are not ours to start or stop.

The agent-tasks worker is restarted when `workflows/` or `contracts/` changed since it started
(their digest, its build id by default): the SDK's sandbox imports a workflow's modules afresh
from disk for every run, beside the contracts the worker loaded at its start, so an old worker
would run the new workflow code against the old contracts (a new field failed every workflow
task of a run, which then waited forever). The other workers keep their code until `tempered
down`: their activities are loaded once.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from contracts.names import Queue
from infra.processes import Service
from infra.settings import Settings
from workers.versioning import workflow_code_digest

RESTARTED = "restarted: workflows/ or contracts/ changed since it started (a run still pinned to its build waits for a worker of that build)"


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
    code = workflow_code_digest()
    for queue in Queue:
        service = worker_service(settings, queue)
        if service.pid() is not None:
            if queue is not Queue.AGENT_TASKS or service.code() in (None, code):
                lines.append(f"worker {queue.value}: already running")
                continue
            service.stop(timeout_s=40)
            lines.append(f"worker {queue.value}: {RESTARTED}")
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
