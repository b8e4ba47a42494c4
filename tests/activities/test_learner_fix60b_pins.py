"""A learner that loads a LoRA version keeps its adapter cached while it fetches the base, on a
real SeaweedFS (activities/learner.py `_engine_at`, infra/policy_cache.py `pinned_policy`).

The learner fetched the adapter, then the base, pinning neither: with the cache full of
versions an inference worker on the same machine pins, the base's fetch evicted the adapter the
learner was about to load, and the step failed (every retry alike, while the pins held)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

from activities.learner import LearnerActivities
from contracts.learner import GRPOConfig, StepRecord, TrainStepRequest
from contracts.run import PrepareRunRequest
from infra.learner_base import Learner
from infra.policy import publish_policy
from infra.policy_cache import fetch_policy, pin, unpin
from infra.settings import S3Settings, Settings
from infra.storage import ObjectStore
from tests.activities.test_learner import write_group
from tests.fixtures.policy_dirs import version_dir

RUN = "run-lora-pins"
OTHER = "run-served"
"""Another run whose versions an inference worker on the machine fetches."""
KEEP = 2
"""Versions the machine's cache keeps (the least allowed)."""
LORA = GRPOConfig(learning_rate=1e-3, micro_batch_size=4, max_staleness=8, lora_rank=4)


def request(store: ObjectStore, step: int) -> TrainStepRequest:
    group = write_group(store, f"t{step}", step, step + 1, RUN)
    return TrainStepRequest(run_id=RUN, step=step, groups=[group], config=LORA)


@pytest.mark.asyncio
async def test_a_restarted_learner_loads_an_adapter_while_inference_pins_another(
    store: ObjectStore, tmp_path: Path
) -> None:
    """v1 and v2 are adapters over v0; an inference worker pins v1. A restarted learner at step
    2 fetches v2 (v0 and v1 stay: the base, and pinned), then v0, whose room came from v2."""
    settings = Settings(home=tmp_path / "home", s3=S3Settings(policy_cache_versions=KEEP))
    env = ActivityEnvironment()
    acts = LearnerActivities(settings, store)
    await env.run(acts.prepare_run, PrepareRunRequest(run_id=RUN, base_model="tiny"))
    for step in (0, 1):
        assert (await env.run(acts.train_step, request(store, step))).policy.adapter_of == 0
    served = pin(fetch_policy(store, RUN, 1, settings.policy_cache, KEEP))  # inference's
    assert served is not None
    try:
        restarted = LearnerActivities(settings, store)
        done = await env.run(restarted.train_step, request(store, 2))
    finally:
        unpin(served)
    assert (done.policy.version, done.policy.adapter_of, done.trained) == (3, 0, 4)
    assert restarted.engine is not None and restarted.engine.version == 3


class ServedMeanwhile(LearnerActivities):
    """The real activities, with an inference worker on the same machine fetching two versions
    of another run once the engine is ready (before the step's KL reference is first read)."""

    def _engine_at(self, *args: Any, **kwargs: Any) -> Learner:
        engine = super()._engine_at(*args, **kwargs)
        for version in (0, 1):
            fetch_policy(self.store, OTHER, version, self.settings.policy_cache, KEEP)
        return engine


@pytest.mark.asyncio
async def test_the_kl_reference_stays_cached_until_the_step_reads_it(
    store: ObjectStore, tmp_path: Path
) -> None:
    """The engine reads its KL reference (v0) at the step's first use of it, not when it is
    named: fetches by another process meanwhile evicted v0 from under it."""
    settings = Settings(home=tmp_path / "home", s3=S3Settings(policy_cache_versions=KEEP))
    for version in (0, 1):
        publish_policy(store, OTHER, version, version_dir(tmp_path, f"other{version}"))
    env = ActivityEnvironment()
    acts = ServedMeanwhile(settings, store)
    await env.run(acts.prepare_run, PrepareRunRequest(run_id=RUN, base_model="tiny"))
    config = GRPOConfig(learning_rate=1e-3, micro_batch_size=4, max_staleness=8, kl_coef=0.1)
    group = write_group(store, "t0", 0, 1, RUN)
    step = TrainStepRequest(run_id=RUN, step=0, groups=[group], config=config)
    done = await env.run(acts.train_step, step)
    assert (done.policy.version, done.trained) == (1, 4)
    assert "kl_ref" in store.get_model(done.ack.key, StepRecord).metrics  # the reference was read
