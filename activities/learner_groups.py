"""A learner step's groups, stored in parts and read back (blocking; `LearnerActivities` calls
these in a thread):

    ref = put_step_groups(store, part)      # `store_step_groups`: one part, create-only
    part = get_step_groups(store, ref)      # `load_step_groups`: one part (a learner's carry)
    req = with_groups(store, req)           # `train_step`: the request with every group inline
    trajectories = read_group(store, req, g)

A step's groups travel by reference where they would pass a payload in its `TrainStepRequest`
(workflows/learner_request.py decides), and so do the pending groups a learner's state hands on
past a payload (workflows/learner_carry.py), read back a part at a time. A part is named by its
digest, so writing it again (a retried activity) is a no-op and a step asked again with other
groups never meets it. A part that is missing, altered or for another step fails the step (or
the read) without retry (`activities/stored.py`): no retry brings it back.
"""

from __future__ import annotations

import hashlib

from activities.stored import read_model
from contracts.common import ObjectRef
from contracts.errors import invalid
from contracts.learner import StepGroups, TrainStepRequest
from contracts.trajectory import Trajectory
from infra import keys
from infra.storage import ObjectStore


def put_step_groups(store: ObjectStore, part: StepGroups) -> ObjectRef:
    """Store `part` at `keys.learner_step_groups_key`, once."""
    digest = hashlib.sha256(part.model_dump_json().encode()).hexdigest()
    key = keys.learner_step_groups_key(part.run_id, part.step, digest)
    return store.put_json(key, part, create_only=True)


def get_step_groups(store: ObjectStore, ref: ObjectRef, where: str = "ref") -> StepGroups:
    """The part `ref` names, verified against it."""
    return read_model(store, where, ref, StepGroups)


def with_groups(store: ObjectStore, req: TrainStepRequest) -> TrainStepRequest:
    """`req` with the groups of its `group_parts` after its own, and no parts."""
    if not req.group_parts:
        return req
    groups = list(req.groups)
    for index, ref in enumerate(req.group_parts):
        where = f"group_parts[{index}]"
        part = get_step_groups(store, ref, where)
        if (part.run_id, part.step) != (req.run_id, req.step):
            raise invalid(where, f"{ref.key} holds step {part.step} of run {part.run_id}")
        groups.extend(part.groups)
    return req.model_copy(update={"groups": groups, "group_parts": []})


def read_group(store: ObjectStore, req: TrainStepRequest, index: int) -> list[Trajectory]:
    """The trajectories of `req.groups[index]`, each verified against its ref."""
    group = req.groups[index]
    if len(group.rewards) not in (0, len(group.trajectories)):
        raise invalid(f"groups[{index}].rewards", "not one reward per trajectory")
    return [
        read_model(store, f"groups[{index}].trajectories[{j}]", ref, Trajectory)
        for j, ref in enumerate(group.trajectories)
    ]
