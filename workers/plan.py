"""What a worker entry hands the runtime: its activities (or workflows) and its limits, and
`close_each`, how the runtime and an entry close what they hold at shutdown."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("tempered.worker")


@dataclass
class WorkerPlan:
    """Everything `workers.runtime` needs to run one task queue's worker."""

    activities: Sequence[Callable[..., Any]] = ()
    workflows: Sequence[type] = ()
    max_concurrent_activities: int = 16
    on_shutdown: Callable[[], Awaitable[None]] | None = None
    drain_s: float = 30.0
    """On SIGTERM, how long in-flight activities may finish before they are cancelled (and
    retried elsewhere, from the start). Below the pod's terminationGracePeriodSeconds in the
    chart (tests/charts/test_chart_drain.py), or Kubernetes kills the process first."""
    heartbeat_every_s: float | None = None
    """At most this long between the heartbeats the worker sends to the server (None: the SDK's
    throttle, up to 60 s). A cancel reaches an activity with the server's answer to a heartbeat,
    so this also bounds how long a cancel takes to arrive."""
    own_queue: str | None = None
    """A second task queue that only this process polls (Temporal's worker-specific queue:
    the sandbox worker's sessions live here), served with `own_queue_activities`."""
    own_queue_activities: Sequence[Callable[..., Any]] = ()
    own_queue_max_concurrent: int = 256
    """Activities of the own queue at once. High: they wait for a sandbox slot inside the
    activity, so a busy worker's steps still start (a step that does not start within its
    schedule-to-start timeout makes the workflow think the worker is gone)."""
    uses_store: bool = False
    """Whether its activities use the object store (settings.s3): the runtime then checks the
    store at start and exits in one line where it refuses the credentials or never answers
    (`infra.storage_checks.check_access`), rather than report ready and fail every activity."""


async def close_each(closes: Sequence[tuple[str, Callable[[], object] | None]]) -> None:
    """Run each close (a function, or one that returns an awaitable; None: nothing to close) in
    order, whatever the earlier ones did: one that raises is logged as `what` failed, and the
    next one runs (one pool's error skipped the others' closes and the telemetry's last flush)."""
    for what, close in closes:
        if close is None:
            continue
        try:
            done = close()
            if inspect.isawaitable(done):
                await done
        except Exception:
            log.exception("%s failed", what)
