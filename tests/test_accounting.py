"""The exactly-once ledger (tests/accounting.py) can fail: fabricated trajectories and learner
acks in a real SeaweedFS bucket, first as a correct run records them, then broken one rule at a
time; `assert_exactly_once` must pass the first and reject each of the others."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from contracts.episode import EpisodeEnd
from contracts.learner import StepRecord
from contracts.trajectory import Trajectory, trajectory_id
from infra import keys
from infra.storage import ObjectStore
from tests.accounting import account

RUN = "ledger"
GROUP = 2
TASKS = ["t0", "t1", "t2", "t3"]  # step 0 trains t0, t1; step 1 trains t2, t3


def trajectory(task: str, sample: int, reward: float) -> Trajectory:
    """A minimal stored document: the ledger reads only who it is, not its tokens."""
    return Trajectory(
        id=trajectory_id(RUN, task, sample),
        run_id=RUN,
        task_id=task,
        sample=sample,
        group_size=GROUP,
        prompt="p",
        token_ids=[1, 2, 3],
        loss_mask=[0, 0, 1],
        logprobs=[0.0, 0.0, -0.5],
        steps=[],
        end=EpisodeEnd.STEP_BUDGET,
        reward=reward,
        solved=False,
        policy_version=0,
        created_at="now",
    )


def ids(*tasks: str) -> list[str]:
    return [trajectory_id(RUN, task, sample) for task in tasks for sample in range(GROUP)]


def good_acks() -> list[StepRecord]:
    """Step 0: t0 trained (rewards differ), t1 skipped (equal rewards); step 1: t2 trained,
    t3 dropped as stale."""
    zero_advantage = "zero advantage: every sample of its group got the same reward"
    return [
        StepRecord(
            run_id=RUN,
            step=0,
            attempt="a0",
            groups=["t0", "t1"],
            loss=0.1,
            trained=ids("t0"),
            skipped=dict.fromkeys(ids("t1"), zero_advantage),
            dropped_stale=[],
            reward_mean=0.0,
            duration_s=1.0,
            metrics={"rows": 2.0},
        ),
        StepRecord(
            run_id=RUN,
            step=1,
            attempt="a1",
            groups=["t2", "t3"],
            loss=0.1,
            trained=ids("t2"),
            dropped_stale=ids("t3"),
            reward_mean=0.0,
            duration_s=1.0,
            metrics={"rows": 2.0},
        ),
    ]


def write_run(store: ObjectStore, acks: list[StepRecord]) -> None:
    for task in TASKS:
        for sample in range(GROUP):
            doc = trajectory(task, sample, reward=float(sample) if task in ("t0", "t2") else 0.0)
            store.put_json(keys.trajectory_key(RUN, task, sample), doc)
    for record in acks:
        store.put_json(keys.learner_ack_key(RUN, record.step), record)


def test_a_correct_run_passes_and_counts_each_kind_apart(store: ObjectStore) -> None:
    write_run(store, good_acks())
    ledger = account(store, RUN, tasks=len(TASKS), group_size=GROUP)
    ledger.assert_exactly_once()
    assert (ledger.trained, ledger.skipped, ledger.dropped_stale) == (4, 2, 2)
    assert ledger.steps == 2 and ledger.acked == 8


def listed_twice_across_steps(acks: list[StepRecord]) -> None:
    acks[1].trained.append(acks[0].trained[0])


def listed_twice_in_one_step(acks: list[StepRecord]) -> None:
    acks[0].skipped[acks[0].trained[0]] = "also skipped"


def never_acked(acks: list[StepRecord]) -> None:
    acks[1].dropped_stale.pop()


def acked_but_not_stored(acks: list[StepRecord]) -> None:
    acks[1].trained.append(trajectory_id(RUN, "t9", 0))


def trained_by_a_step_that_applied_nothing(acks: list[StepRecord]) -> None:
    acks[0].metrics = {"rows": 0.0}


def skipped_without_a_reason(acks: list[StepRecord]) -> None:
    acks[0].skipped[ids("t1")[0]] = ""


def acked_by_the_wrong_step(acks: list[StepRecord]) -> None:  # t2's ids in step 0, t1's in 1
    acks[0].trained, acks[1].trained = ids("t2"), ids("t0")


def a_group_split_over_steps(acks: list[StepRecord]) -> None:
    moved = ids("t3")[1]
    acks[1].dropped_stale.remove(moved)
    acks[0].groups.append("t3")
    acks[0].dropped_stale.append(moved)


BREAKS: list[Callable[[list[StepRecord]], None]] = [
    listed_twice_across_steps,
    listed_twice_in_one_step,
    never_acked,
    acked_but_not_stored,
    trained_by_a_step_that_applied_nothing,
    skipped_without_a_reason,
    acked_by_the_wrong_step,
    a_group_split_over_steps,
]


@pytest.mark.parametrize("breaking", BREAKS, ids=[b.__name__ for b in BREAKS])
def test_a_broken_ledger_fails(
    store: ObjectStore, breaking: Callable[[list[StepRecord]], None]
) -> None:
    acks = good_acks()
    breaking(acks)
    write_run(store, acks)
    with pytest.raises(AssertionError):
        account(store, RUN, tasks=len(TASKS), group_size=GROUP).assert_exactly_once()


def test_a_trajectory_stored_twice_or_under_a_wrong_key_fails(store: ObjectStore) -> None:
    write_run(store, good_acks())
    copy = trajectory("t0", 0, reward=0.0)
    store.put_json(keys.trajectory_key(RUN, "t0-copy", 0), copy)  # same document, second key
    ledger = account(store, RUN, tasks=len(TASKS), group_size=GROUP)
    assert ledger.duplicates == 1 and ledger.mismatched
    with pytest.raises(AssertionError):
        ledger.assert_exactly_once()


def test_a_missing_trajectory_fails(store: ObjectStore) -> None:
    write_run(store, good_acks())
    store.delete(keys.trajectory_key(RUN, "t3", 1))
    with pytest.raises(AssertionError, match="stored 7 != 8"):
        account(store, RUN, tasks=len(TASKS), group_size=GROUP).assert_exactly_once()
