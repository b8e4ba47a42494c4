"""`StepSlots` (workflows/step_slots.py) on its own: the run's bookkeeping of the learner step
each group is for, driven through random runs (the run's gate, tasks finishing in any order,
flat groups redrawn) as TrainingRunWorkflow drives it."""

from __future__ import annotations

import asyncio
import random

import pytest

from contracts.common import ObjectRef
from contracts.learner import TrajectoryGroup
from workflows.step_slots import StepSlots

REF = ObjectRef(key="k", size=1, sha256="0" * 64)


def group(task: int) -> TrajectoryGroup:
    return TrajectoryGroup(task_id=str(task), trajectories=[REF], rewards=[0.0], policy_version=0)


def test_a_later_steps_group_waits_for_the_slow_one() -> None:
    """Four groups a step: tasks 0-7 are for steps 0 and 1; task 3's group comes last."""
    slots = StepSlots(4, sent=0, burst=8)
    steps = []
    for _ in range(8):
        steps.append(slots.next())
        slots.started(steps[-1])
    assert steps == [0] * 4 + [1] * 4
    for task in (0, 1, 2, 4, 5, 6, 7):
        slots.finished(steps[task], group(task))
    assert [g.task_id for g in slots.take_due()] == ["0", "1", "2"]
    slots.finished(steps[3], group(3))
    assert [g.task_id for g in slots.take_due()] == ["3", "4", "5", "6", "7"]
    assert slots.next() == 2


@pytest.mark.asyncio
async def test_one_signal_at_a_time_of_at_most_burst_groups() -> None:
    """While a signal is out, a task finishing leaves its group to the call sending it."""
    slots, signals = StepSlots(4, sent=0, burst=2), []
    out = asyncio.Event()

    async def send(groups: list[TrajectoryGroup]) -> None:
        signals.append([g.task_id for g in groups])
        await out.wait()

    for _ in range(4):
        slots.started(0)
    for task in range(3):
        slots.finished(0, group(task))
    sending = asyncio.create_task(slots.send_due(send))
    await asyncio.sleep(0)
    slots.finished(0, group(3))
    await slots.send_due(send)  # returns at once: a signal is out
    assert signals == [["0", "1"]]
    out.set()
    await sending
    assert signals == [["0", "1"], ["2", "3"]]


def test_a_redrawn_groups_place_goes_to_a_later_steps_group() -> None:
    """Task 1 (step 0) is redrawn while task 2 (step 1) has finished: task 2's group takes its
    place, and the next task is for step 1."""
    slots = StepSlots(2, sent=0, burst=8)
    for step in (0, 0, 1, 1):
        slots.started(step)
    slots.finished(0, group(0))
    slots.finished(1, group(2))
    assert [g.task_id for g in slots.take_due()] == ["0"]
    slots.redrawn(0)
    assert [g.task_id for g in slots.take_due()] == ["2"]
    assert slots.next() == 1


def test_a_segment_continues_from_the_groups_sent() -> None:
    assert StepSlots(4, sent=9, burst=8).next() == 2
    assert StepSlots(4, sent=8, burst=8).next() == 2


@pytest.mark.parametrize("seed", range(200))
def test_no_group_is_sent_after_its_step_and_every_step_fills(seed: int) -> None:
    """A run of random shape: each group goes among the first (b + 1) · groups_per_step sent,
    so the learner trains it by its step b, within `max_staleness` of the version it was started
    on; no step waits for good; without redraws each task is for ⌊filled / groups_per_step⌋
    (the rule before)."""
    rng = random.Random(seed)
    per_step, steps = rng.randint(1, 5), rng.randint(1, 8)
    concurrency, staleness = rng.randint(1, 12), rng.randint(0, 3)
    redraws = rng.choice([0, 0, rng.randint(1, 10)])
    slots, total = StepSlots(per_step, sent=0, burst=concurrency), per_step * steps
    in_flight: list[tuple[int, int]] = []  # (task, step)
    sent: list[tuple[int, int]] = []  # (step, version) of each group sent, in order
    started_as: dict[str, tuple[int, int]] = {}
    filled = started = redrawn = 0
    while len(sent) < total:
        learner_steps = len(sent) // per_step
        may_start = filled < total and len(in_flight) < concurrency
        may_start = may_start and learner_steps >= slots.next() - staleness  # the run's gate
        if may_start and (not in_flight or rng.random() < 0.6):
            step = slots.next()
            if redrawn == 0:
                assert step == filled // per_step
            slots.started(step)
            in_flight.append((started, step))
            started_as[str(started)] = (step, learner_steps)  # pinned to the newest version
            started, filled = started + 1, filled + 1
            continue
        assert in_flight, f"step {learner_steps} waits for good"
        task, step = in_flight.pop(rng.randrange(len(in_flight)))
        if redrawn < redraws and rng.random() < 0.3:
            redrawn, filled = redrawn + 1, filled - 1
            slots.redrawn(step)
        else:
            slots.finished(step, group(task))
        while due := slots.take_due():  # as the run sends them: a signal at a time
            sent += [started_as[g.task_id] for g in due]
    late = [(place, *g) for place, g in enumerate(sent) if place // per_step > g[0]]
    assert not late, f"(place, step, version) of groups trained after their step: {late}"
    stale = [(place, *g) for place, g in enumerate(sent) if place // per_step - g[1] > staleness]
    assert not stale, f"(place, step, version) of groups dropped as stale: {stale}"
