"""Which tasks a TrainingRunWorkflow draws and evaluates, on the time-skipping test server with
scripted tasks, suite and train step (tests/workflows/control_plane.py): `heldout_limit` spreads
the same held-out tasks over every segment, and flat groups are redrawn up to the run's limit
(dynamic sampling), spread over its steps and across continue-as-new."""

from __future__ import annotations

import pytest
from temporalio.service import RPCError, RPCStatusCode

from contracts.run import draw_order, drawn_task, redraws_allowed, spread
from infra.storage import ObjectStore
from tests.fixtures.temporal import time_skipping_server
from tests.workflows.control_plane import ScriptedSuite, ScriptedTrainer, control_plane, run_to_end
from tests.workflows.test_training_run import RUN


def test_spread_keeps_the_ends_and_the_spacing() -> None:
    tasks = ScriptedSuite(train=0, heldout=10).heldout
    assert [t.id for t in spread(tasks, 4)] == [tasks[i].id for i in (0, 2, 5, 7)]
    assert spread(tasks, 0) == spread(tasks, 10) == spread(tasks, 99) == tasks
    assert spread(tasks, 1) == tasks[:1]  # a limit of one is one task, not all of them


@pytest.mark.asyncio
async def test_heldout_limit_evaluates_the_same_spread_tasks_in_every_segment(
    store: ObjectStore,
) -> None:
    """`heldout_limit` 4 of 10 held-out tasks: the first eval (in the first segment) and the
    last (after the run continued as new) both run exactly the spread 4."""
    run = RUN.model_copy(update={"run_id": "spread", "steps": 12, "heldout_limit": 4})
    suite = ScriptedSuite(train=30, heldout=10)
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, suite, ScriptedTrainer()),
    ):
        result, continued = await run_to_end(env.client, run, "train-spread")
        evaluated = set()
        for task in suite.heldout:
            try:
                await env.client.get_workflow_handle(f"spread-eval-v0-{task.id}").describe()
                evaluated.add(task.id)
            except RPCError as err:
                assert err.status == RPCStatusCode.NOT_FOUND
    assert continued, "no continue-as-new"
    assert [(e.policy_version, e.tasks) for e in result.evals] == [(0, 4), (12, 4)]
    assert evaluated == {t.id for t in spread(suite.heldout, 4)}


@pytest.mark.asyncio
@pytest.mark.parametrize("redraws", [0, 5, 100])
async def test_flat_groups_are_redrawn_up_to_the_limit(store: ObjectStore, redraws: int) -> None:
    """A third of the tasks give flat groups. With `redraw_flat_groups` 5, five flat groups
    never reach the learner and five more tasks take their slots, so the learner still gets
    20 × 2 groups, each task once (the count survives continue-as-new); the five are spread
    over the run (one before the first step), so flat groups reach the first steps too. With
    100 (never used up), no flat group reaches it, also those that finish after every slot has
    started; with 0, every group is sent, flat or not."""
    grpo = RUN.grpo.model_copy(update={"redraw_flat_groups": redraws})
    run = RUN.model_copy(update={"run_id": f"flat-{redraws}", "steps": 20, "grpo": grpo})
    trainer, suite = ScriptedTrainer(), ScriptedSuite(train=30, flat_every=3)
    async with (
        time_skipping_server() as env,
        control_plane(env.client, store, suite, trainer),
    ):
        result, continued = await run_to_end(env.client, run, f"train-flat-{redraws}")
    trained, slots = trainer.trained(), run.steps * run.grpo.groups_per_step
    order = draw_order(suite.train, run.seed)
    started = [drawn_task(order, i).id for i in range(result.tasks_started)]
    not_trained = set(started) - set(trained)
    flat_trained = sum(t.startswith("flat-") for t in trained)
    assert continued, "no continue-as-new"
    assert (result.steps, len(trained)) == (run.steps, slots)
    assert result.tasks_done == result.tasks_started == slots + result.redrawn
    assert sorted(trained) == sorted(set(trained)) and set(trained) <= set(started)
    assert len(not_trained) == result.redrawn and all(t.startswith("flat-") for t in not_trained)
    early_flat = [t for step in range(3) for t in trainer.steps[step] if t.startswith("flat-")]
    if redraws == 100:
        assert flat_trained == 0 and 0 < result.redrawn < redraws
    else:
        assert result.redrawn == redraws and flat_trained >= 5, "no flat group was ever sent"
        assert early_flat, (
            "the first steps' flat groups were all redrawn: the budget was not spread"
        )


def test_the_redraw_budget_is_spread_over_the_steps() -> None:
    assert [redraws_allowed(8, 7, done) for done in range(7)] == [2, 3, 4, 5, 6, 7, 8]
    assert redraws_allowed(5, 20, 0) == 1 and redraws_allowed(5, 20, 19) == 5
    assert redraws_allowed(0, 7, 3) == 0 and redraws_allowed(100, 20, 0) == 5
