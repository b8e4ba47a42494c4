"""What a worker entry hands the runtime: its activities (or workflows) and its limits."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any


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
