"""A finished run's prune (`tempered runs prune`: `infra.retention.prune_versions`) deletes every
stored part of its learner's groups (`keys.learner_step_groups_key`: a step's groups past a
payload, and pending groups a segment carried), on a real SeaweedFS, and keeps the learner's
acks and ledger beside them and another run's parts. Before, only `tempered runs rm` removed
them: ~2.9 MB a step at 64 groups of G = 256, gigabytes over a long run. The live prune's rule
(a step's parts once the next step is acknowledged) and a step retried after it:
tests/activities/test_retention_step_parts.py."""

from __future__ import annotations

from collections import Counter

from activities.learner_groups import put_step_groups
from contracts.common import ObjectRef
from contracts.learner import StepGroups, TrajectoryGroup
from infra import keys
from infra.retention import prune_versions
from infra.storage import ObjectStore
from tests.infra.test_retention_bounds import publish_fakes

RUN = "parted"


def store_part(store: ObjectStore, run: str, step: int, task: str) -> ObjectRef:
    """A part of step `step`'s groups, as `store_step_groups` stores it: one group of `task`."""
    ref = store.put_text(keys.trajectory_key(run, task, 0), task)
    group = TrajectoryGroup(task_id=task, trajectories=[ref], rewards=[1.0], policy_version=step)
    return put_step_groups(store, StepGroups(run_id=run, step=step, groups=[group]))


def parts_of(store: ObjectStore, run: str) -> Counter[int]:
    """How many parts each step of `run` has stored."""
    steps = (keys.learner_step_groups_of(run, key) for key in store.list_keys(keys.RUNS_PREFIX))
    return Counter(step for step in steps if step is not None)


def test_the_key_of_a_part_names_its_step() -> None:
    part = keys.learner_step_groups_key(RUN, 12, "ab" * 32)
    assert keys.learner_step_groups_of(RUN, part) == 12
    others = [
        keys.learner_ack_key(RUN, 12),
        keys.learner_ledger_key(RUN, 3),
        keys.learner_step_groups_key(f"{RUN}-2", 12, "ab" * 32),  # another run's
        keys.learner_step_groups_key(RUN, 12, "ab"),  # no digest
    ]
    assert [keys.learner_step_groups_of(RUN, key) for key in others] == [None] * 4


def test_a_finished_runs_prune_deletes_every_part_of_its_learner(store: ObjectStore) -> None:
    publish_fakes(store, RUN, range(3))
    for step, task in [(0, "a"), (1, "b"), (1, "c"), (2, "d"), (2, "carried")]:
        store_part(store, RUN, step, task)
    kept = [keys.learner_ack_key(RUN, 0), keys.learner_ack_key(RUN, 1)]
    kept.append(keys.learner_ledger_key(RUN, 0))
    for key in kept:
        store.put_text(key, "{}")
    store_part(store, f"{RUN}-2", 0, "other")
    assert parts_of(store, RUN) == {0: 1, 1: 2, 2: 2}

    assert prune_versions(store, RUN, keep=1) == [1]
    assert not parts_of(store, RUN)
    assert all(store.exists(key) for key in kept)  # acks (`runs show`) and the ledger stay
    assert parts_of(store, f"{RUN}-2") == {0: 1}
