"""Worker processes in the background, one per task queue (what `tempered train` relies on).

`ensure_workers` starts `tempered worker QUEUE` for every queue that has no live worker of
ours; `stop_workers` (called by `tempered down`) stops them by pidfile.
"""

from __future__ import annotations

import os
import sys

from contracts.names import Queue
from infra.processes import Service
from infra.settings import Settings


def worker_service(settings: Settings, queue: Queue) -> Service:
    return Service(f"worker-{queue.value}", settings.home)


def ensure_workers(settings: Settings, queues: list[Queue] | None = None) -> list[str]:
    lines = []
    env = {**os.environ, "TEMPERED_HOME": str(settings.home)}
    for queue in queues or list(Queue):
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


def worker_status(settings: Settings) -> dict[str, str]:
    result = {}
    for queue in Queue:
        pid = worker_service(settings, queue).pid()
        result[f"worker {queue.value}"] = f"running (pid {pid})" if pid else "stopped"
    return result
