"""Worker of the `sandbox` queue: runs model-written programs against their tests.

    tempered worker sandbox        # or: python -m workers.cli worker sandbox

Uses `settings.sandbox.backend` (local bubblewrap by default, gvisor, or kubernetes Jobs) and
the object store (settings.s3). Runs as root on a host with bwrap (local) or runsc (gvisor).
"""

from __future__ import annotations

from activities.sandbox import SandboxActivities
from infra.settings import Settings
from workers.plan import WorkerPlan


def build(settings: Settings) -> WorkerPlan:
    activities = SandboxActivities(settings)
    return WorkerPlan(
        activities=[activities.execute],
        max_concurrent_activities=max(4, settings.sandbox.concurrency),
        on_shutdown=activities.close,
    )
