"""`ensure_workers`: one background worker per queue, and a new agent-tasks worker once the
workflow code changed (its workflows would otherwise import the new files beside the old
contracts). The workers here are sleepers standing in for `tempered worker QUEUE`."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from contracts.names import Queue
from infra.settings import Settings
from workers.background import RESTARTED, ensure_workers, stop_workers, worker_service
from workers.versioning import workflow_code_digest


def sleeper(queue: Queue) -> list[str]:
    return [sys.executable, "-c", "import time; time.sleep(60)", queue.value]


@pytest.fixture
def settings(tmp_path: Path) -> Iterator[Settings]:
    settings = Settings(home=tmp_path)
    yield settings
    for queue in Queue:
        worker_service(settings, queue).stop(timeout_s=5)


def test_a_worker_per_queue_started_once(settings: Settings) -> None:
    started = ensure_workers(settings, sleeper)
    assert [line.split(":")[1].split()[0] for line in started] == ["started"] * len(Queue)
    pids = {q: worker_service(settings, q).pid() for q in Queue}
    assert all(pids.values()) and len(set(pids.values())) == len(Queue)
    assert ensure_workers(settings, sleeper) == [
        f"worker {q.value}: already running" for q in Queue
    ]
    assert {q: worker_service(settings, q).pid() for q in Queue} == pids
    assert stop_workers(settings) == [f"worker {q.value}: stopped" for q in Queue]


def test_the_workflow_worker_restarts_when_the_workflow_code_changed(settings: Settings) -> None:
    ensure_workers(settings, sleeper)
    old = {q: worker_service(settings, q).pid() for q in Queue}
    for queue in Queue:  # as if each had started on the code before a change
        pidfile = worker_service(settings, queue).pidfile
        pidfile.write_text(json.dumps({**json.loads(pidfile.read_text()), "code": "before"}))
    lines = ensure_workers(settings, sleeper)
    tasks = worker_service(settings, Queue.AGENT_TASKS)
    assert lines[:2] == [
        f"worker agent-tasks: {RESTARTED}",
        f"worker agent-tasks: started (log {tasks.logfile})",
    ]
    assert lines[2:] == [f"worker {q.value}: already running" for q in Queue][1:]
    assert not psutil.pid_exists(old[Queue.AGENT_TASKS]) or (
        psutil.Process(old[Queue.AGENT_TASKS]).status() == psutil.STATUS_ZOMBIE
    )
    assert tasks.pid() not in (None, old[Queue.AGENT_TASKS])
    assert tasks.code() == workflow_code_digest()
    others = {q: worker_service(settings, q).pid() for q in Queue if q is not Queue.AGENT_TASKS}
    assert others == {q: pid for q, pid in old.items() if q is not Queue.AGENT_TASKS}
