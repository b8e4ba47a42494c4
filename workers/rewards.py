"""Worker of the `rewards` queue: writes each finished agent task's trajectories to S3, once.

    tempered worker rewards        # or: python -m workers.cli worker rewards

Needs only the object store (settings.s3); no GPU, no sandbox.
"""

from __future__ import annotations

from contracts.names import Queue
from infra.settings import Settings
from workers.plan import WorkerPlan

QUEUE = Queue.REWARDS


def build(settings: Settings) -> WorkerPlan:
    from activities.rewards import RewardActivities
    from infra.storage import ObjectStore

    activities = RewardActivities(ObjectStore.from_settings(settings))
    return WorkerPlan(activities=[activities.write_trajectories], max_concurrent_activities=16)
