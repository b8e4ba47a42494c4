"""A signal sent by a workflow of another build decodes here although it carries fields this
build does not know (`SignalPayload`): a training run and its learner run on different builds
for as long as one of them has not yet continued as new onto the current one, and the SDK drops,
with a log line only, a signal whose payload fails to decode. With unknown fields refused, a
newer learner's `learner_progress` (`state_bytes`) and `learner_done` (`GRPOConfig.epochs` in
its final state) were lost on an older run, which then waited for the learner for ever.

Every signal of every workflow is decoded here with an unknown field in each of its objects,
through the converter and the argument types the worker uses; the learner receives such an
`add_groups` on the test server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic_core import to_jsonable_python
from temporalio import workflow
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from contracts import common
from contracts.common import ObjectRef
from contracts.learner import (
    GRPOConfig,
    LearnerDone,
    LearnerInput,
    LearnerProgress,
    PolicyVersion,
    TrainStepResponse,
    TrajectoryGroup,
)
from contracts.names import Queue, Signal
from tests.fixtures.temporal import time_skipping_server
from workflows.agent_task import AgentTaskWorkflow
from workflows.learner import LearnerWorkflow
from workflows.training_run import TrainingRunWorkflow

REF = ObjectRef(key="k", size=1, sha256="0" * 64)
GROUP = TrajectoryGroup(task_id="t-e0", trajectories=[REF], rewards=[0.0, 1.0], policy_version=0)
STEP = TrainStepResponse(
    policy=PolicyVersion(run_id="r", version=1, prefix="p/", step=1), loss=0.5, trained=2, ack=REF
)
SENT: dict[Signal, list[object]] = {  # each signal's arguments, as the other build sends them
    Signal.LEARNER_PROGRESS: [LearnerProgress(step=1, policy_version=1, trained_groups=2)],
    Signal.LEARNER_DONE: [
        LearnerDone(
            final=LearnerInput(
                run_id="r", config=GRPOConfig(), pending=[GROUP], history=[STEP], step=1
            )
        )
    ],
    Signal.ADD_GROUPS: [[GROUP]],
    Signal.STOP: ["enough"],
    Signal.ABORT: ["enough"],
    Signal.FINISH: [],
    Signal.PING: [],
}
WORKFLOWS = (TrainingRunWorkflow, LearnerWorkflow, AgentTaskWorkflow)


def with_unknown_fields(value: Any) -> Any:
    """`value` (JSON) with a field no build knows in each of its objects."""
    if isinstance(value, dict):
        return {key: with_unknown_fields(item) for key, item in value.items()} | {"later": 1}
    if isinstance(value, list):
        return [with_unknown_fields(item) for item in value]
    return value


def signals() -> dict[str, list[type] | None]:
    """Every signal the workflows handle: its name and its arguments' types (None for a handler
    taking any arguments, `stop`'s and `abort`'s: the SDK decodes them as plain JSON)."""
    found: dict[str, list[type] | None] = {}
    for cls in WORKFLOWS:
        for name, signal in workflow._Definition.must_from_class(cls).signals.items():
            assert name is not None
            found[name] = signal.arg_types
    return found


def test_every_signal_is_covered() -> None:
    assert sorted(signals()) == sorted(SENT)


@pytest.mark.parametrize("signal", sorted(SENT))
def test_a_signal_with_fields_this_build_does_not_know_decodes(signal: Signal) -> None:
    types = signals()[signal]
    sent = [to_jsonable_python(arg) for arg in SENT[signal]]
    later = [with_unknown_fields(arg) for arg in sent]
    converter = pydantic_data_converter.payload_converter
    decoded = converter.from_payloads(converter.to_payloads(later), types)
    assert decoded == SENT[signal]


@pytest.mark.parametrize("unknown", [False, True])
def test_a_payload_of_this_build_is_validated_once(
    monkeypatch: pytest.MonkeyPatch, unknown: bool
) -> None:
    """Every payload was validated twice with a walk of all its items between (the lenient
    pass, then the known part): a 600 KB `add_groups` took a loaded worker's workflow task past
    the SDK's 2 s deadlock bound (TMPRL1101, retried). One with fields this build does not know
    still takes that path, and decodes to the same value."""
    walked: list[object] = []
    real = common._known_part
    monkeypatch.setattr(common, "_known_part", lambda v, k: walked.append(k) or real(v, k))
    sent = to_jsonable_python(SENT[Signal.LEARNER_DONE][0])
    decoded = LearnerDone.model_validate(with_unknown_fields(sent) if unknown else sent)
    assert decoded == SENT[Signal.LEARNER_DONE][0]
    assert bool(walked) == unknown


def test_the_payloads_that_are_not_signals_still_refuse_unknown_fields() -> None:
    """A typo in a run's input or an activity's request is an error, not a default."""
    refused = with_unknown_fields(LearnerInput(run_id="r").model_dump(mode="json"))
    with pytest.raises(ValueError, match="later"):
        LearnerInput.model_validate(refused)


@pytest.mark.asyncio
async def test_the_learner_takes_a_group_signalled_with_fields_it_does_not_know() -> None:
    async with (
        time_skipping_server() as env,
        Worker(env.client, task_queue=Queue.AGENT_TASKS.value, workflows=[LearnerWorkflow]),
    ):
        handle = await env.client.start_workflow(
            LearnerWorkflow.run,
            LearnerInput(run_id="r", config=GRPOConfig(groups_per_step=2), max_steps=1),
            id="learner-later-fields",
            task_queue=Queue.AGENT_TASKS.value,
        )
        group = with_unknown_fields(GROUP.model_dump(mode="json"))
        await handle.signal(Signal.ADD_GROUPS, [group])
        for _ in range(200):
            status = await handle.query(LearnerWorkflow.status)
            if status.pending:
                break
            await asyncio.sleep(0.05)
        assert status.pending == [GROUP]
        await handle.terminate()
