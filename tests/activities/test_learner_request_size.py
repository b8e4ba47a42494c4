"""The real `train_step` on groups stored in parts (`store_step_groups`, the request's
`group_parts`), through temporalio's ActivityEnvironment on a real SeaweedFS: it trains them as
if inline, a retry answers the recorded step (the ack's groups are the parts'), and a part of
another step is refused without retry. When a step's groups go by reference:
tests/workflows/test_learner_request_size.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.learner import LearnerActivities
from contracts.errors import ErrorType
from contracts.learner import StepGroups, StepRecord, TrainStepRequest
from contracts.run import PrepareRunRequest
from infra import keys
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.activities.test_learner import CONFIG, RUN, write_group


@pytest.mark.asyncio
async def test_train_step_reads_its_groups_from_their_parts(
    store: ObjectStore, tmp_path: Path
) -> None:
    acts, env = LearnerActivities(Settings(home=tmp_path / "home"), store), ActivityEnvironment()
    await env.run(acts.prepare_run, PrepareRunRequest(run_id=RUN, base_model="tiny"))
    groups = [write_group(store, "t1", 0, 1), write_group(store, "t2", 0, 2)]
    parts = [StepGroups(run_id=RUN, step=0, groups=[group]) for group in groups]
    refs = [await env.run(acts.store_step_groups, part) for part in parts]
    assert await env.run(acts.store_step_groups, parts[0]) == refs[0]  # a retry: stored once
    assert all(ref.key.startswith(keys.learner_prefix(RUN) + "step-000000-groups-") for ref in refs)

    request = TrainStepRequest(run_id=RUN, step=0, groups=[], group_parts=refs, config=CONFIG)
    first = await env.run(acts.train_step, request)
    assert first.policy.version == 1 and first.trained == 8
    ack = store.get_model(keys.learner_ack_key(RUN, 0), StepRecord)
    assert ack.groups == ["t1", "t2"] and len(ack.trained) == 8
    # a retry answers the recorded step: its groups, read from the parts, are the ack's
    assert await env.run(acts.train_step, request) == first

    later = StepGroups(run_id=RUN, step=1, groups=[write_group(store, "t3", 1, 3)])
    wrong = await env.run(acts.store_step_groups, later)
    step1 = TrainStepRequest(run_id=RUN, step=1, groups=[], group_parts=[refs[0]], config=CONFIG)
    with pytest.raises(ApplicationError, match=r"group_parts\[0\].*step 0") as refused:
        await env.run(acts.train_step, step1)
    assert refused.value.type == ErrorType.INVALID_INPUT and refused.value.non_retryable
    step1 = step1.model_copy(update={"group_parts": [wrong]})
    assert (await env.run(acts.train_step, step1)).policy.version == 2
