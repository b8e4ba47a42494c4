"""`ensure_workers`: one background worker per queue, and a new one once its code changed (the
agent-tasks worker's workflows would otherwise import the new files beside the old contracts;
an activity worker would go on running the old activities). The workers here are sleepers
standing in for `tempered worker QUEUE`."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from contracts.names import Queue
from infra.processes import free_port
from infra.settings import Settings, TemporalSettings
from workers.background import (
    PINNED,
    RECONFIGURED,
    RESTARTED,
    ensure_workers,
    stop_workers,
    worker_service,
)
from workers.versioning import activity_code_digest, workflow_code_digest


def no_temporal() -> TemporalSettings:  # noqa: N802
    """Where no Temporal answers: no worker polling the default address's queues counts."""
    return TemporalSettings(address=f"127.0.0.1:{free_port()}")


def sleeper(queue: Queue) -> list[str]:
    return [sys.executable, "-c", "import time; time.sleep(60)", queue.value]


@pytest.fixture
def settings(tmp_path: Path) -> Iterator[Settings]:
    settings = Settings(home=tmp_path, temporal=no_temporal())
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


def test_two_commands_at_once_start_each_worker_once(settings: Settings) -> None:
    """`tempered train` twice at once: each saw no worker and started one, and the second
    pidfile hid the first worker from `tempered down` (now the check and the start are one
    step under the service's lock)."""
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda _: ensure_workers(settings, sleeper), range(2)))
    started = [line for lines in both for line in lines if ": started" in line]
    assert len(started) == len(Queue), both
    assert len(_running_in(settings.home)) == len(Queue)  # no second, unseen worker


def _running_in(home: Path) -> list[psutil.Process]:
    """Processes started there (`Service.start` runs each with that working directory)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.cwd() == str(home) and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def code_of(settings: Settings, queue: Queue) -> str:
    """The code digest its worker started on (its settings' digest follows it)."""
    return str(worker_service(settings, queue).code()).split()[0]


def test_a_worker_started_with_other_settings_is_restarted(settings: Settings) -> None:
    """`TEMPERED_INFERENCE__BACKEND=vllm tempered train` after a run on the local backend: the
    workers once went on with the old settings, saying "already running"."""
    ensure_workers(settings, sleeper)
    old = {q: worker_service(settings, q).pid() for q in Queue}
    vllm = settings.model_copy(
        update={"inference": settings.inference.model_copy(update={"backend": "vllm"})}
    )
    lines = ensure_workers(vllm, sleeper)
    assert lines[::2] == [f"worker {q.value}: {RECONFIGURED}" for q in Queue], lines
    assert all(worker_service(settings, q).pid() not in (None, old[q]) for q in Queue)
    assert ensure_workers(vllm, sleeper) == [f"worker {q.value}: already running" for q in Queue]


def started_on(settings: Settings, codes: dict[Queue, str]) -> None:
    """As if each worker of `codes` had started on that code."""
    for queue, code in codes.items():
        pidfile = worker_service(settings, queue).pidfile
        pidfile.write_text(json.dumps({**json.loads(pidfile.read_text()), "code": code}))


def restarted(settings: Settings, lines: list[str], old: dict[Queue, int | None]) -> set[Queue]:
    """The queues whose worker `lines` say was restarted, checked against the processes."""
    said = {
        q for q in Queue if any(line.startswith(f"worker {q.value}: {RESTARTED}") for line in lines)
    }
    for queue in Queue:
        pid = worker_service(settings, queue).pid()
        assert (pid != old[queue]) == (queue in said), (queue, lines)
        if queue in said:
            gone = old[queue]
            assert gone is not None and (
                not psutil.pid_exists(gone) or psutil.Process(gone).status() == psutil.STATUS_ZOMBIE
            )
    return said


def test_a_worker_restarts_when_its_code_changed(settings: Settings) -> None:
    ensure_workers(settings, sleeper)
    activity_workers = [q for q in Queue if q is not Queue.AGENT_TASKS]
    assert {code_of(settings, q) for q in activity_workers} == {activity_code_digest()}
    old = {q: worker_service(settings, q).pid() for q in Queue}
    started_on(settings, {Queue.AGENT_TASKS: "before"})  # a workflow or a contract changed
    lines = ensure_workers(settings, sleeper)
    assert restarted(settings, lines, old) == {Queue.AGENT_TASKS}
    assert lines[0] == f"worker agent-tasks: {RESTARTED}{PINNED}"
    assert code_of(settings, Queue.AGENT_TASKS) == workflow_code_digest()

    old = {q: worker_service(settings, q).pid() for q in Queue}
    started_on(settings, {Queue.SANDBOX: "before", Queue.REWARDS: "before"})  # an activity's code
    lines = ensure_workers(settings, sleeper)
    assert restarted(settings, lines, old) == {Queue.SANDBOX, Queue.REWARDS}
    assert f"worker sandbox: {RESTARTED}" in lines
    assert code_of(settings, Queue.SANDBOX) == activity_code_digest()


def test_workers_get_the_workspaces_root_this_command_resolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative root given in a section's JSON variable resolves against this command's
    folder; the workers run in home, where the same text named another folder."""
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("TEMPERED_SANDBOX", json.dumps({"workspaces": {"root": "ws"}}))
    settings = Settings(home=tmp_path / "home", temporal=no_temporal())
    seen = tmp_path / "seen"

    def telling(queue: Queue) -> list[str]:
        script = "import os, sys; open(sys.argv[1], 'w').write(os.environ.get(sys.argv[2], ''))"
        told = seen / queue.value
        return [sys.executable, "-c", script, str(told), "TEMPERED_SANDBOX__WORKSPACES__ROOT"]

    seen.mkdir()
    try:
        ensure_workers(settings, telling)
        told = seen / Queue.SANDBOX.value
        for _ in range(100):
            if told.exists() and told.read_text():
                break
            time.sleep(0.05)
        assert told.read_text() == str(here / "ws")
    finally:
        stop_workers(settings)
