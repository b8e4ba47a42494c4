"""Worker of the `rewards` queue: writes each finished agent task's trajectories to S3, once,
loads task suites for training runs (`load_tasks`), keeps the learner's ledger
(`record_ledger`, `find_consumed`) and deletes the policy versions a run no longer keeps
(`prune_policies`).

    tempered worker rewards        # or: python -m workers.cli worker rewards

Needs only the object store (settings.s3); no GPU, no sandbox.
"""

from __future__ import annotations

from activities.ledger import LedgerActivities
from activities.retention import RetentionActivities
from activities.rewards import RewardActivities
from activities.tasks import TaskActivities
from infra.settings import Settings
from infra.storage import ObjectStore
from workers.plan import WorkerPlan


def build(settings: Settings) -> WorkerPlan:
    store = ObjectStore.from_settings(settings)
    rewards, ledger = RewardActivities(store), LedgerActivities(store)
    tasks = TaskActivities(settings)
    return WorkerPlan(
        activities=[
            rewards.write_trajectories,
            tasks.load_tasks,
            ledger.record_ledger,
            ledger.find_consumed,
            RetentionActivities(store).prune_policies,
        ],
        max_concurrent_activities=16,
        uses_store=True,
    )
