"""Fields a release added to a contract whose receivers refuse unknown fields stay off the wire
while empty (`contracts.common.empty_left_out`): a `train_step` request with its groups inline
is the one the release before sent, so a learner worker of that release still takes it (with
`"group_parts": []` on the wire it refused every step, "Extra inputs are not permitted", and
the SDK retried it for ever)."""

from __future__ import annotations

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter

from contracts.common import Contract, ObjectRef
from contracts.learner import GRPOConfig, LearnerInput, TrainStepRequest, TrajectoryGroup

CONVERTER = pydantic_data_converter.payload_converter
PART = ObjectRef(key="runs/r/learner/step-000000-groups-0.json", size=1, sha256="0" * 64)


class PreviousTrainStepRequest(Contract):
    """`TrainStepRequest` as 6b064d8 (the release before `group_parts`) declared it."""

    run_id: str
    step: int
    groups: list[TrajectoryGroup]
    config: GRPOConfig


def group() -> TrajectoryGroup:
    return TrajectoryGroup(task_id="t0", trajectories=[PART], rewards=[1.0], policy_version=0)


def test_an_inline_request_is_the_previous_releases() -> None:
    request = TrainStepRequest(run_id="r", step=0, groups=[group()], config=GRPOConfig())
    [payload] = CONVERTER.to_payloads([request])
    assert b"group_parts" not in payload.data
    [previous] = CONVERTER.from_payloads([payload], [PreviousTrainStepRequest])
    assert previous.model_dump() == request.model_dump(exclude={"group_parts"})


def test_a_request_by_reference_names_its_parts() -> None:
    request = TrainStepRequest(
        run_id="r", step=0, groups=[], config=GRPOConfig(), group_parts=[PART]
    )
    [payload] = CONVERTER.to_payloads([request])
    assert CONVERTER.from_payloads([payload], [TrainStepRequest]) == [request]
    with pytest.raises(Exception, match="group_parts"):
        CONVERTER.from_payloads([payload], [PreviousTrainStepRequest])


@pytest.mark.parametrize("parts", [[], [PART]])
def test_a_learner_state_names_pending_parts_only_when_it_has_some(parts: list[ObjectRef]) -> None:
    state = LearnerInput(run_id="r", pending_parts=parts)
    [payload] = CONVERTER.to_payloads([state])
    assert (b"pending_parts" in payload.data) is bool(parts)
    assert CONVERTER.from_payloads([payload], [LearnerInput]) == [state]
