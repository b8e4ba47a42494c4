"""Bounded staleness end to end: a real tiny-preset run with `max_staleness = 1`, so groups are
sampled from older versions than the one that trains on them, checked from the store alone.

Three learner steps of two groups each, rollouts running one step ahead of the learner
(asynchronous GRPO), on starter training tasks only (a suite file without held-out tasks, so
the run spends no time on evaluations). `kl_coef > 0` gives every sample of the untrained tiny model a row in the
update (its rewards are all equal, so without the KL term every group would be skipped for zero
advantage and nothing would be "trained"). Each learner ack says, per trajectory, what the step
holding version n did with it; the trajectory says which versions sampled it. Checked:
- a trajectory trained or skipped at step n was sampled no more than `max_staleness` versions
  earlier;
- at least one trajectory was sampled from an older version than the step that trained it
  (otherwise the run tested nothing asynchronous);
- every trajectory is accounted exactly once (trained + skipped + dropped_stale, apart).

Not checked here: the `drop` policy. The run starts no group more than `max_staleness` steps
ahead of the learner, so a group reaches it too stale only when it finishes behind groups
started later, which this run does not arrange: it normally drops nothing. The learner's
dropping is tested where stale groups are made on purpose (tests/infra/test_grpo.py,
tests/infra/test_learner_engine.py).

It runs on the session's `trained_stack` (tests/fixtures/trained_stack.py: one worker per queue,
shared with the other training tests) under a run id of its own, and checks the store by it.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from infra.tasks import load_suite
from infra.tasks.jsonl import write_jsonl
from tests.accounting import learner_acks, stored_trajectories
from tests.fixtures.drill import Drill
from tests.fixtures.stack import Stack

pytestmark = pytest.mark.xdist_group("trained_stack")  # on the worker that holds it
MAX_STALENESS = 1
STEPS = 3  # the fewest in which a trajectory could be trained too stale (2 behind, at step 2)


def test_groups_from_older_versions_are_trained_within_the_bound(
    trained_stack: Stack, tmp_path: Path
) -> None:
    stack = trained_stack
    started = time.monotonic()
    run_id = "stale"
    suite = tmp_path / "train-only.jsonl"
    write_jsonl(load_suite("starter", split="train")[:12], suite)
    workflow_id, tasks, group_size = stack.start_training(
        run_id,
        STEPS,
        suite=str(suite),
        max_staleness=MAX_STALENESS,
        stale_policy="drop",
        kl_coef=0.05,
    )
    Drill(stack, [workflow_id]).check_training_run("staleness", run_id, tasks, group_size, started)

    store = stack.store()
    oldest = {doc.id: doc.oldest_policy_version for _, doc in stored_trajectories(store, run_id)}
    lag: dict[str, list[int]] = {"trained": [], "skipped": [], "dropped_stale": []}
    for record in learner_acks(store, run_id):  # step n trains on the engine holding version n
        for kind, listed in (
            ("trained", record.trained),
            ("skipped", list(record.skipped)),
            ("dropped_stale", record.dropped_stale),
        ):
            lag[kind] += [record.step - oldest[i] for i in listed]
    print(f"[staleness] versions behind, per kind: {lag}")
    used = lag["trained"] + lag["skipped"]
    assert all(0 <= behind <= MAX_STALENESS for behind in used), lag
    assert any(behind >= 1 for behind in lag["trained"]), (
        f"no trajectory from an older version was trained: {lag}"
    )
