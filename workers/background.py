"""Worker processes in the background, one per task queue (what `tempered train` relies on).

`ensure_workers` starts `tempered worker QUEUE` (as `python -m workers.cli worker QUEUE`) for
every queue that has no live worker of ours; `stop_workers` (called by `tempered down`) stops
them by pidfile; `background_workers` lists the live ones (`tempered status`). Workers started
any other way (a terminal, a pod) are not ours to start or stop, nor to double: a queue that one
of them polls gets no worker of ours (`served_elsewhere`, asked of Temporal), said in one line.
Beside a foreground `tempered worker all`, `train` started a second worker of every queue, and
two learners alternated steps, each with its own optimizer state. Temporal lists a worker's
poller for minutes after its last poll, dead or not: one of this host counts while its process
(the pid its identity names) lives; one of another host counts while listed (a busy worker does
not poll: a learner in a long step). A foreground worker of older code or other settings serves
its queue until it is stopped: the line says so.

A worker whose code changed since it started is restarted (its activities in flight are
retried by Temporal, as after any worker's death). The agent-tasks worker's code is
`workflows/` and `contracts/` (their digest, its build id by default): the SDK's sandbox imports
a workflow's modules afresh from disk for every run, beside the contracts the worker loaded at
its start, so an old worker would run the new workflow code against the old contracts (a new
field failed every workflow task of a run, which then waited forever). An activity worker's
code is every other package: it loads its activities once, so after an edit (a task suite, an
environment) it would go on running the old ones. A worker started with other settings (another
backend, bucket or model: `TEMPERED_*` or the TOML file) is restarted too; before, it served the
new command with the old ones, saying only "already running". The settings' digest covers
their secrets (a rotated `s3.secret_key`), keyed by `home/run/settings.key` (its owner's alone):
the pidfiles that hold it are anyone's to read.

A worker being stopped (`tempered down`, a restart) gets its queue's drain (`drain_s`) and
`STOP_MARGIN_S` more (the cancelled activities' cleanup, its closes, its exit) before SIGKILL: the
learner's step in flight was killed 40 s into its 270 s, and redone. `stop_workers` stops them
all at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import secrets
import socket
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
from pydantic import SecretBytes, SecretStr
from temporalio.service import RPCError

from activities.heartbeat import CANCEL_GRACE_S
from contracts.names import Queue
from infra.processes import Service, port_open
from infra.settings import Settings
from infra.stack_services import temporal_endpoint
from workers.backlog import Poller, queue_pollers
from workers.identity import identity_host_pid
from workers.plan import WorkerPlan
from workers.versioning import activity_code_digest, workflow_code_digest

RESTARTED = "restarted: its code changed since it started"
ROOT_VARIABLE = "TEMPERED_SANDBOX__WORKSPACES__ROOT"
RECONFIGURED = "restarted: this command's settings differ from those it started with"
SERVED = (
    "not started: a worker this command did not start polls its queue (stop it for one of this"
    " code and these settings)"
)
PINNED = " (a run still pinned to the old build waits for a worker of that build)"


CLOSE_BUDGET_S = 20.0
"""How long a worker's closes may take once its activities have ended: its sessions, pools,
engine or ranks, and telemetry (`workers.runtime.run_workers`; telemetry's own flush is bounded
by `infra.telemetry.SHUTDOWN_S`)."""
EXIT_SLACK_S = 10.0
"""After the closes, the interpreter's own exit: atexit handlers, threads joined, the last
telemetry export. A kill at exactly drain + cancel grace + closes could land in it."""
STOP_MARGIN_S = CANCEL_GRACE_S + CLOSE_BUDGET_S + EXIT_SLACK_S
"""After a worker's drain, room for its own shutdown before it is killed: the SDK cancels the
activities still running, which take up to `CANCEL_GRACE_S` to clean up, then the worker
closes, then its interpreter exits (`EXIT_SLACK_S`). At 10 s the cancelled activities' cleanup
could take all of it, and the closes none. The chart's terminationGracePeriodSeconds leave at
least as much (tests/charts/test_chart_drain.py)."""

DRAINS: dict[Queue, float] = {Queue.LEARNER: 270.0}
"""The queues whose worker plan sets its own `drain_s` (from here, by `drain_s`); the others
keep `WorkerPlan`'s. The learner's step in flight may finish (and publish): a step takes
minutes, and a cancelled one is redone from its start. The chart gives the learner's pod 310 s."""


def drain_s(queue: Queue) -> float:
    """How long `queue`'s worker lets activities in flight finish after SIGTERM."""
    return DRAINS.get(queue, WorkerPlan.drain_s)


def stop_timeout_s(queue: Queue) -> float:
    """How long a stop waits for `queue`'s worker before SIGKILL."""
    return drain_s(queue) + STOP_MARGIN_S


def settings_digest(settings: Settings) -> str:
    """What tells a worker's settings from another's: their dump, secrets revealed (a rotated
    `s3.secret_key` is other settings) and keyed, so a pidfile's digest never gives one away."""
    text = json.dumps(settings.model_dump(), sort_keys=True, default=_reveal)
    return hmac.new(_digest_key(settings.home), text.encode(), hashlib.sha256).hexdigest()[:16]


def _reveal(value: object) -> str:
    """A value JSON has no form for, as text: a secret's own value, anything else its str."""
    if isinstance(value, SecretStr | SecretBytes):
        return repr(value.get_secret_value())
    return str(value)


def _digest_key(home: Path) -> bytes:
    """This home's key of `settings_digest`: made once, readable by its owner alone."""
    path = home / "run" / "settings.key"
    if not path.exists():
        _new_key(path)
    try:
        return bytes.fromhex(path.read_text())
    except ValueError:
        raise ValueError(f"{path} is not a key this program wrote: remove it") from None


def _new_key(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{secrets.token_hex(8)}.part")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(secrets.token_hex(32))
    try:
        with contextlib.suppress(FileExistsError):
            os.link(partial, path)  # whole, and the first one made wins
    finally:
        partial.unlink()


def worker_service(settings: Settings, queue: Queue) -> Service:
    return Service(f"worker-{queue.value}", settings.home)


def worker_command(queue: Queue) -> list[str]:
    return [sys.executable, "-m", "workers.cli", "worker", queue.value]


ASK_S = 10.0
"""How long `served_elsewhere` waits for Temporal's answer, to connect and again to ask."""


def served_elsewhere(settings: Settings, ours: set[int]) -> dict[Queue, str]:
    """Queue → the identity of a live worker that polls it and is not one of `ours` (our
    workers' pids: one restarted for new code polled until now); none where Temporal does not
    answer: then nothing can serve a queue, and a worker of ours is started as before."""
    endpoint = temporal_endpoint(settings)
    if not port_open(endpoint.host, endpoint.port):
        return {}
    with ThreadPoolExecutor(1) as thread:  # `train --attach` calls this from its event loop
        try:
            pollers = thread.submit(asyncio.run, _pollers(settings)).result()
        except (RuntimeError, OSError, TimeoutError, RPCError):
            return {}  # cannot tell
    alive = {q: [p.identity for p in found if _alive(p, ours)] for q, found in pollers.items()}
    return {queue: identities[0] for queue, identities in alive.items() if identities}


async def _pollers(settings: Settings) -> dict[Queue, list[Poller]]:
    from workers.runtime import connect, quiet_runtime  # noqa: PLC0415 (it imports this module)

    client = await asyncio.wait_for(connect(settings, runtime=quiet_runtime()), ASK_S)
    found = await asyncio.wait_for(
        asyncio.gather(*(queue_pollers(client, queue) for queue in Queue)), ASK_S
    )
    return dict(zip(Queue, found, strict=True))


def _alive(poller: Poller, ours: set[int]) -> bool:
    """Whether the worker behind `poller` may still run and is not one of `ours`: by its process
    where its identity (`workers.identity`: queue@host:pid) names this host; else it may."""
    host, pid = identity_host_pid(poller.identity)
    if host != socket.gethostname() or pid is None:  # its process cannot be looked at: listed,
        return True  # it may be alive (a busy worker does not poll: a learner in a long step)
    if pid in ours:
        return False
    try:
        process = psutil.Process(pid)
        # a pid reused since: a process younger than the poll is another one
        young = process.create_time() > poller.last_access.timestamp() + 1
        return not young and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def ensure_workers(
    settings: Settings, command: Callable[[Queue], list[str]] = worker_command
) -> list[str]:
    lines = []
    ours = {pid for queue in Queue if (pid := worker_service(settings, queue).pid()) is not None}
    elsewhere = served_elsewhere(settings, ours)
    env = {**os.environ, "TEMPERED_HOME": str(settings.home)}
    if settings.config is not None:  # the workers read the same TOML file as this process
        env["TEMPERED_CONFIG"] = str(settings.config)
    # resolved against this command's folder (from a variable of its own or its section's
    # JSON), not the workers' (home): the same root for this command and its workers
    env[ROOT_VARIABLE] = str(settings.sandbox.workspaces.root)
    workflow_code, activity_code = workflow_code_digest(), activity_code_digest()
    configured = settings_digest(settings)
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
                service.stop(timeout_s=stop_timeout_s(queue))
                moved = running.split()[0] != code.split()[0]  # the code, not just the settings
                why = RESTARTED + (PINNED if workflows else "") if moved else RECONFIGURED
                lines.append(f"worker {queue.value}: {why}")
            if (other := elsewhere.get(queue)) is not None:
                lines.append(f"worker {queue.value}: {SERVED} ({other})")
                continue
            service.start(command(queue), env=env, code=code)
            lines.append(f"worker {queue.value}: started (log {service.logfile})")
    return lines


def stop_workers(settings: Settings) -> list[str]:
    """Stop our background workers, all at once, each given its drain."""

    def stop(queue: Queue) -> bool:
        return worker_service(settings, queue).stop(timeout_s=stop_timeout_s(queue))

    with ThreadPoolExecutor(len(Queue)) as pool:
        stopped = list(pool.map(stop, Queue))
    return [f"worker {q.value}: stopped" for q, was in zip(Queue, stopped, strict=True) if was]


def background_workers(settings: Settings) -> dict[Queue, int]:
    """Queue → pid of its live background worker."""
    pids = {queue: worker_service(settings, queue).pid() for queue in Queue}
    return {queue: pid for queue, pid in pids.items() if pid is not None}
