"""`ensure_workers` (what `tempered train` runs) beside a worker it did not start: a foreground
`tempered worker QUEUE` (README: a task started by hand) already polls its queue, so no second
worker of that queue starts (two learners would alternate steps, each with its own optimizer
state); once that worker is dead its queue gets one, though Temporal still lists its poller for a
while. A real stack and a real `tempered worker QUEUE` (rewards: an activity queue; agent-tasks:
the versioned workflow worker); the workers `ensure_workers` starts are sleepers standing in
for the others."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from contracts.names import Queue
from tests.fixtures.stack import Stack, start_stack, take_down
from workers.background import (
    RESTARTED,
    SERVED,
    _alive,
    ensure_workers,
    stop_workers,
    worker_command,
    worker_service,
)
from workers.backlog import Poller, queue_pollers
from workers.identity import worker_identity
from workers.runtime import connect

pytestmark = [pytest.mark.timeout(300), pytest.mark.xdist_group(__name__)]


def sleeper(queue: Queue) -> list[str]:
    return [sys.executable, "-c", "import time; time.sleep(60)", queue.value]


@pytest.fixture(scope="module")
def module_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One stack for this module's tests (a start is 5-15 s): they start and stop workers
    only, each on its own pidfiles and pids (a dead worker's poller Temporal still lists is
    what `ensure_workers` must not count), and leave Temporal and S3 as they found them."""
    stack = start_stack(tmp_path_factory.mktemp("pollers"))
    try:
        yield stack
    finally:
        take_down(stack)


@pytest.fixture
def stack_and_workers(module_stack: Stack) -> Iterator[Stack]:
    yield module_stack
    module_stack.stop_workers()
    stop_workers(module_stack.settings)


def polled_by(stack: Stack, queue: Queue, pid: int) -> bool:
    """Temporal lists a poller of `queue` with that process's pid."""

    async def ask() -> list[str]:
        client = await connect(stack.settings)
        return [poller.identity for poller in await queue_pollers(client, queue)]

    return any(identity.endswith(f":{pid}") for identity in asyncio.run(ask()))


@pytest.mark.parametrize("foreground", [Queue.REWARDS, Queue.AGENT_TASKS], ids=lambda q: q.value)
def test_a_queue_a_foreground_worker_serves_gets_no_second_one(
    stack_and_workers: Stack, foreground: Queue
) -> None:
    stack = stack_and_workers
    stack.start_worker(foreground)
    stack.wait_workers_ready(queues=[foreground])
    pid = stack.workers[foreground].pid
    stack.wait_for("its poller", lambda: polled_by(stack, foreground, pid), 30)

    lines = ensure_workers(stack.settings, sleeper)
    said = f"worker {foreground.value}: {SERVED}"
    skipped = [line for line in lines if line.startswith(said)]
    assert len(skipped) == 1 and f"{foreground.value}@" in skipped[0], lines
    assert skipped[0].endswith(f":{pid})"), lines
    assert worker_service(stack.settings, foreground).pid() is None
    others = [q for q in Queue if q is not foreground]
    assert all(worker_service(stack.settings, q).pid() is not None for q in others), lines

    stack.kill_worker(foreground)  # its poller stays listed a while: it must not count
    assert polled_by(stack, foreground, pid)
    lines = ensure_workers(stack.settings, sleeper)
    assert f"worker {foreground.value}: started" in "\n".join(lines), lines
    assert worker_service(stack.settings, foreground).pid() is not None


def test_a_worker_of_ours_restarted_for_new_code_is_started_again(
    stack_and_workers: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Our own worker polls its queue when `ensure_workers` asks Temporal; its code changed,
    so it is stopped: it must be started again, not taken for a worker of someone else's."""
    stack = stack_and_workers
    for name, value in stack.env.items():  # what `tempered train` has: its workers inherit it
        if name.startswith("TEMPERED_"):
            monkeypatch.setenv(name, value)

    def command(queue: Queue) -> list[str]:
        return worker_command(queue) if queue is Queue.REWARDS else sleeper(queue)

    ensure_workers(stack.settings, command)
    pid = worker_service(stack.settings, Queue.REWARDS).pid()
    assert pid is not None
    stack.wait_for("our worker's poller", lambda: polled_by(stack, Queue.REWARDS, pid), 60)
    pidfile = worker_service(stack.settings, Queue.REWARDS).pidfile
    pidfile.write_text(json.dumps({**json.loads(pidfile.read_text()), "code": "before"}))

    lines = ensure_workers(stack.settings, command)
    assert f"worker rewards: {RESTARTED}" in lines, lines
    assert not any(line.startswith(f"worker rewards: {SERVED}") for line in lines), lines
    assert worker_service(stack.settings, Queue.REWARDS).pid() not in (None, pid), lines


def test_a_poller_of_another_host_counts_however_long_ago_it_polled() -> None:
    """A busy worker does not poll (a learner in a long step polls again only after it): one of
    another host, whose process cannot be looked at, counts while Temporal lists it; one of this
    host while its process lives and is not one of ours."""
    long_ago = datetime(2026, 1, 1, tzinfo=UTC)
    assert _alive(Poller(identity="learner@elsewhere:12", last_access=long_ago), set())
    here = Poller(identity=worker_identity("learner"), last_access=datetime.now(UTC))
    assert _alive(here, set()) and not _alive(here, {os.getpid()})
