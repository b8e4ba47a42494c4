"""Worker of the `inference` queue: samples completions from the newest (or a pinned) policy.

    tempered worker inference      # or: python -m workers.cli worker inference

`settings.inference.backend` picks transformers in this process (`local`, CPU by default) or a
vLLM server (`vllm`). Concurrent `generate` activities share one batcher; up to
`inference.max_activities` are accepted at once, so their rows queue in the worker, where
priorities hold (a run's evaluations wait behind its training rollouts), not in the task queue.
Needs the object store (history artefacts, policy versions). torch and transformers are
imported when the worker is built, not when this module is.
"""

from __future__ import annotations

from infra.settings import Settings
from workers.plan import WorkerPlan


def build(settings: Settings) -> WorkerPlan:
    # activities.inference brings the model stack (torch, transformers, the vLLM client):
    # only an inference worker pays for it, not `tempered --help` nor the other queues' workers
    from activities.inference import InferenceActivities

    activities = InferenceActivities(settings)
    return WorkerPlan(
        activities=[activities.generate],
        max_concurrent_activities=settings.inference.max_activities,
        on_shutdown=activities.close,
        uses_store=True,
    )
