"""The `train_step` request of a `LearnerWorkflow` step, its groups inline or by reference.

    request = await train_request(state, batch)   # in the workflow, once per step

A group travels as its G trajectories' refs: ~45 KB as JSON at G = 256, so one request of a
step's groups passed Temporal's 2 MiB payload limit at ~47 groups, and the workflow task that
scheduled it failed on every retry (the learner RUNNING for ever, no step taken). The bound on
the groups one payload carries is the run's for its `add_groups` signals, `SIGNAL_BYTES` (half a
payload; `requests.in_parts` splits it, a single larger group alone). A batch within it
(`groups_bytes`) goes inline, as before. A larger one goes by reference
(`STEP_PARTS_PATCH`, asked only then): each part is stored by the `store_step_groups` activity
(queue `learner`), and the request names the parts (`TrainStepRequest.group_parts`), which
`train_step` reads back (activities/learner_groups.py). Its history carries the groups once
more, as a request of them did: the learner's look-ahead (its largest step) counts them as
before.

The parts are stored one workflow task at a time (`SERIAL_PARTS_PATCH`, asked with
`STEP_PARTS_PATCH`): the server writes what a workflow task completes, with the events buffered
while it ran (signals of up to `SIGNAL_BYTES` of groups), in one transaction of at most 4 MiB,
and terminates a workflow that passes it ("Transaction size exceeds limit"). Scheduled all at
once (before the patch), a step of 64 groups at G = 256 put ~2.8 MB of parts in one, and two
signals beside them passed it.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contracts.common import ObjectRef
    from contracts.learner import (
        LearnerInput,
        StepGroups,
        TrainStepRequest,
        TrajectoryGroup,
    )
    from contracts.names import Activity
    from workflows.activity_options import activity_options
    from workflows.requests import in_parts, json_bytes
    from workflows.step_slots import SIGNAL_BYTES

STEP_PARTS_PATCH = "tempered-learner-step-groups-by-reference"
"""Marks runs whose steps of groups past `SIGNAL_BYTES` store them in parts and name the parts
in their request. Before, the request carried them all: past 2 MiB, it was refused."""
SERIAL_PARTS_PATCH = "tempered-learner-step-parts-one-at-a-time"
"""Marks runs that store a step's parts one workflow task at a time (before: all at once)."""


def groups_bytes(groups: list[TrajectoryGroup]) -> int:
    """`groups` as a JSON list, in bytes."""
    return sum(json_bytes(group) + 1 for group in groups) + 1


async def train_request(state: LearnerInput, batch: list[TrajectoryGroup]) -> TrainStepRequest:
    """The request of step `state.step` on `batch`: inline within `SIGNAL_BYTES`, else by
    reference (`STEP_PARTS_PATCH`, asked only then; the parts stored first)."""
    request = TrainStepRequest(
        run_id=state.run_id, step=state.step, groups=batch, config=state.config
    )
    if groups_bytes(batch) <= SIGNAL_BYTES or not workflow.patched(STEP_PARTS_PATCH):
        return request
    serial = workflow.patched(SERIAL_PARTS_PATCH)
    refs = await store_groups(state, batch, serial=serial)
    return request.model_copy(update={"groups": [], "group_parts": refs})


async def store_groups(
    state: LearnerInput, groups: list[TrajectoryGroup], *, serial: bool = True
) -> list[ObjectRef]:
    """`groups` stored in parts (`requests.in_parts`) as step `state.step`'s by `store_step_groups`,
    one workflow task at a time (`serial`; else all at once): the parts' refs, in order. Also
    the groups a segment carries past a payload (workflows/learner_carry.py)."""
    options = activity_options(Activity.STORE_STEP_GROUPS, state.heartbeat_timeout_s)

    async def store(part: list[TrajectoryGroup]) -> ObjectRef:
        return await workflow.execute_activity(
            Activity.STORE_STEP_GROUPS.value,
            StepGroups(run_id=state.run_id, step=state.step, groups=part),
            result_type=ObjectRef,
            **options,
        )

    parts = in_parts(groups, SIGNAL_BYTES)
    if serial:
        return [await store(part) for part in parts]
    return list(await asyncio.gather(*(store(part) for part in parts)))
