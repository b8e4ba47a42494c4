"""A learner step's figures say what they measure (train_step through temporalio's
ActivityEnvironment, the tiny model on a real SeaweedFS, real telemetry files):

* `reward_mean` is the mean reward of every group sent to the step, a flat one (no gradient)
  included, and the report's curve and the live view say so;
* `duration_s` is the whole step's, from the activity's start (waiting for the engine
  included) to its version saved, and the status figure `learner_step_mean_s` runs on to the
  version published; the optimizer's part alone is the record's `optimizer_s`."""

from __future__ import annotations

import io
import os
import random
import threading
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from rich.console import Console
from temporalio.testing import ActivityEnvironment

from activities.learner import LearnerActivities
from contracts.learner import (
    LearnerProgress,
    StepRecord,
    TrainStepRequest,
    TrainStepResponse,
    TrajectoryGroup,
)
from contracts.run import PrepareRunRequest, RunProgress, TrainingRunInput, TrainingRunResult
from infra import keys
from infra import telemetry as tm
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.activities.test_learner import CONFIG, RUN
from tests.trajectories import Step, trajectory
from workers.cli.progress import view
from workers.cli.report import write_report

HELD_S = 1.5
"""How long another step holds the engine before this one may train."""


def group_of(store: ObjectStore, task: str, rewards: list[float]) -> TrajectoryGroup:
    """A group of version-0 samples of `task` with these rewards."""
    rng = random.Random(task)
    refs = []
    for sample, reward in enumerate(rewards):
        completion = [rng.randrange(3, 259) for _ in range(10)]
        prompt = [1, *(rng.randrange(3, 259) for _ in range(8))]
        record = trajectory(
            [Step(prompt, completion, [-5.5] * len(completion), policy_version=0, code="x")],
            reward=reward,
            run_id=RUN,
            task_id=task,
            sample=sample,
            created_at="2026-01-01T00:00:00+00:00",
        )
        key = keys.trajectory_key(RUN, task, sample)
        refs.append(store.put_json(key, record, create_only=True))
    return TrajectoryGroup(task_id=task, trajectories=refs, rewards=rewards, policy_version=0)


@pytest.mark.asyncio
async def test_the_reward_is_the_mean_of_the_groups_sent_and_is_said_so(
    store: ObjectStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(home=tmp_path / "home")
    env, acts = ActivityEnvironment(), LearnerActivities(settings, store)
    await env.run(acts.prepare_run, PrepareRunRequest(run_id=RUN, base_model="tiny"))
    flat = group_of(store, "flat", [0.0] * 4)  # no gradient: skipped by the step
    mixed = group_of(store, "mixed", [0.0, 1.0, 0.0, 1.0])
    request = TrainStepRequest(run_id=RUN, step=0, groups=[flat, mixed], config=CONFIG)
    response = await env.run(acts.train_step, request)
    assert (response.trained, response.skipped) == (4, 4)
    assert response.reward_mean == pytest.approx(0.25)  # 0.5 is the trained groups' mean

    progress = LearnerProgress(step=1, policy_version=1, trained_groups=2, reward_mean=0.25)
    table = view(TrainingRunInput(run_id=RUN), RunProgress(learner=[progress]), 1.0, settings)
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(table)
    [row] = [line for line in console.export_text().splitlines() if "+0.250" in line]
    assert " ".join(row.split()) == "reward +0.250 (mean of the groups sent to step 1)"

    drawn: list[list[str]] = []
    monkeypatch.setattr(
        Figure,
        "savefig",
        lambda fig, *_, **__: drawn.extend(ax.get_legend_handles_labels()[1] for ax in fig.axes),
    )
    result = TrainingRunResult(
        run_id=RUN, steps=1, tasks_started=2, tasks_done=2, history=[response], evals=[]
    )
    write_report(settings, TrainingRunInput(run_id=RUN, steps=1), result, 1.0)
    [labels] = [labels for labels in drawn if labels and "reward" in labels[0]]
    assert labels[0] == "mean reward of the groups sent to each step"


@pytest.mark.asyncio
async def test_a_steps_time_is_the_whole_steps(store: ObjectStore, tmp_path: Path) -> None:
    """A step that waits for the engine (another step's thread holds it) says it took that
    long, in its answer and in the status figure; its record says the optimizer's part."""
    settings = Settings(home=tmp_path / "home")
    env, acts = ActivityEnvironment(), LearnerActivities(settings, store)
    await env.run(acts.prepare_run, PrepareRunRequest(run_id=RUN, base_model="tiny"))
    mixed = group_of(store, "mixed", [0.0, 1.0, 0.0, 1.0])
    request = TrainStepRequest(run_id=RUN, step=0, groups=[mixed], config=CONFIG)
    telemetry = tm.setup_telemetry(settings, "learner", export_interval_s=60)
    try:
        held = threading.Event()

        def hold_the_engine() -> None:
            with acts._engine_lock:
                held.set()
                threading.Event().wait(HELD_S)

        holder = threading.Thread(target=hold_the_engine, daemon=True)
        holder.start()
        held.wait(10)
        response: TrainStepResponse = await env.run(acts.train_step, request)
        holder.join()
        telemetry.flush()
    finally:
        telemetry.shutdown()
    record = store.get_model(keys.learner_ack_key(RUN, 0), StepRecord)
    assert "duration_s" not in record.metrics, record  # the optimizer's part is named as such
    optimizer_s = record.metrics["optimizer_s"]
    assert optimizer_s > 0
    assert response.duration_s == record.duration_s  # every answer of the step is the same
    assert record.duration_s >= HELD_S + optimizer_s, record
    figures = tm.read_live_figures(settings)[f"learner-{os.getpid()}"]
    assert figures.learner_steps == 1
    assert figures.learner_step_mean_s is not None
    # to the version published: its upload after the record too
    assert figures.learner_step_mean_s >= response.duration_s
