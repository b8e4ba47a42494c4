"""Worker of the `rewards` queue: writes each finished agent task's trajectories to S3, once,
and loads task suites for training runs (`load_tasks`).

    tempered worker rewards        # or: python -m workers.cli worker rewards

Needs only the object store (settings.s3); no GPU, no sandbox.
"""

from __future__ import annotations

from activities.rewards import RewardActivities
from activities.tasks import TaskActivities
from infra.settings import Settings
from infra.storage import ObjectStore
from workers.plan import WorkerPlan


def build(settings: Settings) -> WorkerPlan:
    rewards = RewardActivities(ObjectStore.from_settings(settings))
    tasks = TaskActivities(settings)
    return WorkerPlan(
        activities=[rewards.write_trajectories, tasks.load_tasks], max_concurrent_activities=16
    )
