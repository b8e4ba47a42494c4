"""A worker process's health files, which the Helm chart's probes read.

    health = Health(settings.home, "inference")    # <home>/health/inference.{ready,alive}
    health.clear()                                 # at start: nothing a dead process left
    beating = asyncio.create_task(health.serve(workers, ready))

`ready` is written once every Worker of the process polls (the SDK's `Worker.is_running`: its
namespace was checked and its pollers start), after a worker's whole start (an inference
worker's model load and vLLM engine start, up to `inference.vllm.startup_timeout_s`); it is
removed when the worker stops. `alive` is touched every `ALIVE_EVERY_S` from the event loop from
then on, so it ages while the loop is blocked (a synchronous call in an activity, a deadlock),
however the process's threads fare.

The chart's probes (charts/tempered/templates/_helpers.tpl, `tempered.healthProbe`) read them
with sh and coreutils. Startup and readiness: `ready` holds this container's token and `alive`
was touched less than `STALE_S` ago; liveness: `alive` was. The token (`container_token`) is the
start time of the container's PID 1: the state dir is an emptyDir, which keeps the files of the
pod's last container, and a probe that took them for this one's would end the startup probe's
wait for the engine and hand the loading worker to the liveness probe.

Not here: whether Temporal is still reachable after the start (the SDK retries its polls, and a
restart would not bring back a server that is down), nor a health endpoint (a probe's file is
read without a port or a client).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path

from temporalio.worker import Worker

HEALTH_DIR = "health"
"""The directory of the health files, in the worker's home (the chart's state dir)."""
ALIVE_EVERY_S = 5.0
"""How often the event loop touches `alive`."""
STALE_S = 60
"""An `alive` older than this is a blocked event loop (the chart's probes; liveness restarts
the container after 3 of them in a row, 10 s apart)."""
WAIT_EVERY_S = 0.1
"""How often `serve` looks whether every Worker polls yet."""
PID1_STAT = Path("/proc/1/stat")


def container_token(stat: Path = PID1_STAT) -> str:
    """The start time of this container's PID 1 (clock ticks after boot: the 22nd field of its
    stat, the 20th after the command's name, which may hold spaces); "" where unreadable."""
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


class Health:
    """The health files of the worker process named `name` (its queues, joined by "+")."""

    def __init__(self, home: Path, name: str):
        self.ready = home / HEALTH_DIR / f"{name}.ready"
        self.alive = home / HEALTH_DIR / f"{name}.alive"

    async def serve(self, workers: Sequence[Worker], ready: Callable[[], None]) -> None:
        """Write `ready` once every worker polls (and call `ready()`), then touch `alive`
        every `ALIVE_EVERY_S` until cancelled."""
        while not all(worker.is_running for worker in workers):
            await asyncio.sleep(WAIT_EVERY_S)
        self.ready.parent.mkdir(parents=True, exist_ok=True)
        self.alive.touch()  # first: a ready worker is alive
        self.ready.write_text(container_token())
        ready()
        while True:
            await asyncio.sleep(ALIVE_EVERY_S)
            self.alive.touch()

    def not_ready(self) -> None:
        """The worker stops: no longer ready (it stays alive while it drains)."""
        self.ready.unlink(missing_ok=True)

    def clear(self) -> None:
        """Neither ready nor alive: at start (a dead process's files) and at the end."""
        for path in (self.ready, self.alive):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
