"""train_step on a learner of two ranks (torchrun, gloo on CPU), on a real SeaweedFS: a rank
killed in the middle of a step fails it as retryable, the retry re-forms the group, and the
version is published once; a step cancelled in the middle ends the group and publishes nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities import heartbeat
from activities.learner import LearnerActivities
from contracts.errors import ErrorType
from contracts.learner import TrainStepRequest
from contracts.run import PrepareRunRequest
from infra import keys
from infra.learner_ranks import RankGroup
from infra.policy import latest_policy, policy_manifest
from infra.settings import LearnerSettings, Settings
from infra.storage import ObjectStore
from tests.activities.test_learner import CONFIG, RUN, write_group


@pytest.mark.slow
@pytest.mark.asyncio
async def test_a_killed_rank_fails_the_step_and_the_retry_reforms_the_group(
    store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(home=tmp_path / "home", learner=LearnerSettings(ranks=2))
    env = ActivityEnvironment()
    acts = LearnerActivities(settings, store)
    await env.run(acts.prepare_run, PrepareRunRequest(run_id=RUN, base_model="tiny"))
    step0 = TrainStepRequest(
        run_id=RUN, step=0, groups=[write_group(store, "t1", 0, 1)], config=CONFIG
    )
    first = await env.run(acts.train_step, step0)
    group = acts.engine
    assert isinstance(group, RankGroup) and first.policy.version == 1 and first.trained == 4
    formed = list(group.pids)

    # rank 1 dies at rank 0's first heartbeat of the next step (its first micro-batch done)
    train_step = group.train_step
    killed: list[int] = []

    def killing(
        groups: Sequence[Any], config: Any, heartbeat: Callable[[], None] | None = None
    ) -> Any:
        def beat() -> None:
            if not killed:
                killed.append(group.pids[1])
                os.kill(group.pids[1], signal.SIGKILL)
            if heartbeat is not None:
                heartbeat()

        return train_step(groups, config, heartbeat=beat)

    monkeypatch.setattr(group, "train_step", killing)
    step1 = TrainStepRequest(
        run_id=RUN, step=1, groups=[write_group(store, "t2", 1, 2)], config=CONFIG
    )
    with pytest.raises(ApplicationError, match="learner ranks") as failed:
        await env.run(acts.train_step, step1)
    assert killed == [formed[1]]
    assert failed.value.type == ErrorType.LEARNER_INFRA and not failed.value.non_retryable
    assert group.pids == [] and group.version is None
    assert policy_manifest(store, RUN, 2) is None and latest_policy(store, RUN) == first.policy
    assert not store.exists(keys.learner_ack_key(RUN, 1))

    # the retry (Temporal's next attempt) starts a fresh group, reloads v1 and publishes v2
    second = await env.run(acts.train_step, step1)
    assert second.policy.version == 2 and second.trained == 4
    assert len(group.pids) == 2 and not set(group.pids) & set(formed)
    assert await env.run(acts.train_step, step1) == second  # one more retry: the ack
    named = set()  # every stored policy file is one a manifest names: published once
    for version in (0, 1, 2):
        manifest = policy_manifest(store, RUN, version)
        assert manifest is not None
        named |= {ref.key for ref in manifest.files.values()}
    assert set(store.list_keys(keys.policies_prefix(RUN) + "blobs/")) == named

    # cancelled at its first heartbeat in training: the ranks cannot be interrupted, so the
    # group ends there; nothing is published, and the retry re-forms it
    monkeypatch.setattr(heartbeat, "MAX_EVERY_S", 0.05)
    step_of_the_group = group.train_step

    def slow(
        groups: Sequence[Any], config: Any, heartbeat: Callable[[], None] | None = None
    ) -> Any:
        def beat() -> None:
            time.sleep(0.5)  # the cancel comes meanwhile
            if heartbeat is not None:
                heartbeat()

        return step_of_the_group(groups, config, heartbeat=beat)

    monkeypatch.setattr(group, "train_step", slow)
    cancelling = ActivityEnvironment()
    cancelling.on_heartbeat = lambda *details: (
        details[0].get("phase") == "train" and cancelling.cancel()
    )
    formed = list(group.pids)
    step2 = TrainStepRequest(
        run_id=RUN, step=2, groups=[write_group(store, "t3", 2, 3)], config=CONFIG
    )
    with pytest.raises(asyncio.CancelledError):
        await cancelling.run(acts.train_step, step2)
    assert group.pids == [] and group.version is None
    assert policy_manifest(store, RUN, 3) is None and not store.exists(keys.learner_ack_key(RUN, 2))
    third = await env.run(acts.train_step, step2)
    assert third.policy.version == 3 and not set(group.pids) & set(formed)
    acts.close()
    assert group.pids == []
