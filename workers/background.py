"""Worker processes in the background, one per task queue (what `tempered train` relies on).

`ensure_workers` starts `tempered worker QUEUE` (as `python -m workers.cli worker QUEUE`) for
every queue that has no live worker of ours; `stop_workers` (called by `tempered down`) stops
them by pidfile; `background_workers` lists the live ones (`tempered status`). Workers started
any other way (a terminal, a pod) are not ours to start or stop.
"""

from __future__ import annotations

import os
import sys

from contracts.names import Queue
from infra.processes import Service
from infra.settings import Settings


def worker_service(settings: Settings, queue: Queue) -> Service:
    return Service(f"worker-{queue.value}", settings.home)


def ensure_workers(settings: Settings) -> list[str]:
    lines = []
    env = {**os.environ, "TEMPERED_HOME": str(settings.home)}
    if settings.config is not None:  # the workers read the same TOML file as this process
        env["TEMPERED_CONFIG"] = str(settings.config)
    for queue in Queue:
        service = worker_service(settings, queue)
        if service.pid() is not None:
            lines.append(f"worker {queue.value}: already running")
            continue
        service.start([sys.executable, "-m", "workers.cli", "worker", queue.value], env=env)
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
