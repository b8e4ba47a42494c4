"""train_step's faults through temporalio's ActivityEnvironment, on a real SeaweedFS: weights
that were not published (a failed publish, a lost publish race, a step that failed midway) are
reloaded before the next step, a retry of a published step moves latest.json on, a NaN loss
fails loudly and publishes nothing. The step's happy paths: test_learner.py."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

import activities.learner as learner_module
from activities.learner import LearnerActivities
from contracts.errors import ErrorType
from contracts.learner import StepRecord, TrainStepRequest
from contracts.run import PrepareRunRequest
from infra import grpo, keys
from infra.policy import latest_policy, policy_manifest
from infra.settings import Settings
from infra.storage import ObjectStore, TransientStorageError
from tests.activities.test_learner import CONFIG, RUN, recorded_metrics, write_group


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home")


@pytest.mark.asyncio
async def test_weights_that_were_not_published_are_reloaded(
    store: ObjectStore, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine drops the weights it trained when they are not the published version: a
    publish that failed (the retry trains again from v0), and an attempt that lost the publish
    to an overlapping one (it answers with the winner's version and ack, then reloads it)."""
    recorded = recorded_metrics(monkeypatch)
    env = ActivityEnvironment()
    acts = LearnerActivities(settings, store)
    await env.run(acts.prepare_run, PrepareRunRequest(run_id=RUN, base_model="tiny"))
    request = TrainStepRequest(
        run_id=RUN, step=0, groups=[write_group(store, "t1", 0, 1)], config=CONFIG
    )
    real_publish = learner_module.publish_policy

    def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise TransientStorageError("S3 is away")

    monkeypatch.setattr(learner_module, "publish_policy", unreachable)
    with pytest.raises(TransientStorageError):
        await env.run(acts.train_step, request)
    assert acts.engine is not None and acts.engine.version is None
    assert policy_manifest(store, RUN, 1) is None
    monkeypatch.setattr(learner_module, "publish_policy", real_publish)
    won = await env.run(acts.train_step, request)
    assert won.policy.version == 1 and acts.engine.version == 1

    class Overlapping(LearnerActivities):
        def _recorded(self, req: TrainStepRequest) -> None:
            return None  # it looked before the other attempt published

    late = Overlapping(settings, store)
    assert await env.run(late.train_step, request) == won
    assert late.engine is not None and late.engine.version is None
    winner = store.get_model(keys.learner_ack_key(RUN, 0), StepRecord)
    manifest = policy_manifest(store, RUN, 1)
    assert manifest is not None
    published = StepRecord.model_validate_json(
        store.get_verified(manifest.files["train_step.json"])
    )
    assert published.attempt == winner.attempt
    # one step, recorded by the attempt that published it: not the failed publish's, nor the
    # overlapping attempt's that lost
    assert len(recorded["steps"]) == 1 and recorded["staleness"] == [0] * 4


@pytest.mark.asyncio
async def test_a_step_that_failed_midway_is_retried_from_the_published_weights(
    store: ObjectStore, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of memory (any error) in a step's second epoch: the first epoch's update had moved
    the weights, and the retry trained on top of them (the engine still said v0)."""
    env, acts = ActivityEnvironment(), LearnerActivities(settings, store)
    config = CONFIG.model_copy(update={"epochs": 2})
    real_loss, calls = grpo.grpo_loss, []

    def out_of_memory(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 2:  # the second epoch's pass
            raise RuntimeError("CUDA out of memory")
        return real_loss(*args, **kwargs)

    answers = {}
    for run in ("clean", RUN):
        await env.run(acts.prepare_run, PrepareRunRequest(run_id=run, base_model="tiny"))
        groups = [write_group(store, "t1", 0, 1, run=run)]
        request = TrainStepRequest(run_id=run, step=0, groups=groups, config=config)
        if run == RUN:
            monkeypatch.setattr(grpo, "grpo_loss", out_of_memory)
            with pytest.raises(RuntimeError, match="out of memory"):
                await env.run(acts.train_step, request)
            assert policy_manifest(store, run, 1) is None
        answers[run] = await env.run(acts.train_step, request)
    assert answers[RUN].loss == pytest.approx(answers["clean"].loss, rel=1e-6)
    figures = {
        run: store.get_model(keys.learner_ack_key(run, 0), StepRecord).metrics for run in answers
    }
    for figure in ("grad_norm", "kl_sampler", "clip_fraction"):
        assert figures[RUN][figure] == pytest.approx(figures["clean"][figure], rel=1e-4)


@pytest.mark.asyncio
async def test_a_retry_of_a_published_step_moves_latest_on(
    store: ObjectStore, settings: Settings
) -> None:
    """The attempt that published v1 died before latest.json named it: the retry found the
    version and answered, and latest.json named v0 until the next publish (for ever after
    the last)."""
    env, acts = ActivityEnvironment(), LearnerActivities(settings, store)
    await env.run(acts.prepare_run, PrepareRunRequest(run_id=RUN, base_model="tiny"))
    groups = [write_group(store, "t1", 0, 1)]
    request = TrainStepRequest(run_id=RUN, step=0, groups=groups, config=CONFIG)
    done = await env.run(acts.train_step, request)
    v0 = policy_manifest(store, RUN, 0)
    assert v0 is not None and done.policy.version == 1
    for ack_written in (True, False):
        store.put_json(keys.latest_policy_key(RUN), v0.policy)  # as if it died before moving it
        if not ack_written:
            store.delete(keys.learner_ack_key(RUN, 0))
        assert (await env.run(acts.train_step, request)).policy == done.policy
        assert latest_policy(store, RUN) == done.policy


@pytest.mark.asyncio
async def test_non_finite_loss_fails_loudly_and_publishes_nothing(
    store: ObjectStore, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    acts = LearnerActivities(settings, store)
    env = ActivityEnvironment()
    await env.run(acts.prepare_run, PrepareRunRequest(run_id=RUN, base_model="tiny"))
    request = TrainStepRequest(
        run_id=RUN, step=0, groups=[write_group(store, "t1", 0, 1)], config=CONFIG
    )
    real_loss = grpo.grpo_loss

    def diverging(*args: Any, **kwargs: Any) -> Any:
        loss, stats = real_loss(*args, **kwargs)
        return loss * float("nan"), stats

    monkeypatch.setattr(grpo, "grpo_loss", diverging)
    with pytest.raises(ApplicationError, match="gave loss nan") as err:
        await env.run(acts.train_step, request)
    assert err.value.type == ErrorType.NON_FINITE_LOSS and err.value.non_retryable
    assert policy_manifest(store, RUN, 1) is None and latest_policy(store, RUN).version == 0
    assert not store.exists(keys.learner_ack_key(RUN, 0))

    monkeypatch.setattr(grpo, "grpo_loss", real_loss)  # the fault is gone: the step trains
    done = await env.run(acts.train_step, request)
    assert done.policy.version == 1 and math.isfinite(done.loss)


@pytest.mark.asyncio
async def test_a_learner_killed_while_publishing_leaves_no_weights_behind_once_restarted(
    store: ObjectStore, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed outright (SIGKILL, OOM) while it saved or published, a learner skipped the
    `finally` that removes the attempt's directory: a full copy of the weights under
    home/learner/<run>/, for good. A worker that starts has no attempt in flight: it sweeps."""
    env, acts = ActivityEnvironment(), LearnerActivities(settings, store)
    await env.run(acts.prepare_run, PrepareRunRequest(run_id=RUN, base_model="tiny"))
    request = TrainStepRequest(
        run_id=RUN, step=0, groups=[write_group(store, "t1", 0, 1)], config=CONFIG
    )

    def killed(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("killed")  # with no `finally` run: rmtree does nothing

    with monkeypatch.context() as patch:
        patch.setattr(learner_module, "publish_policy", killed)
        patch.setattr(learner_module, "shutil", SimpleNamespace(rmtree=lambda *a, **k: None))
        with pytest.raises(RuntimeError, match="killed"):
            await env.run(acts.train_step, request)
    work = settings.home / "learner"
    left = list(work.glob(f"{RUN}/.v1.*"))
    assert len(left) == 1 and list(left[0].glob("*.safetensors"))
    other = work / RUN / "notes.txt"  # not an attempt's: kept
    other.write_text("mine")
    restarted = LearnerActivities(settings, store)
    assert not left[0].exists() and other.exists()
    assert (await env.run(restarted.train_step, request)).policy.version == 1
    assert list(work.glob(f"{RUN}/.v*")) == []
