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
