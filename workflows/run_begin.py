"""A training run's beginning, in its first segment only (a continued one resumes instead): the
suite loaded, policy version 0 published and evaluated, the learner started as its child.

    tasks, learner = await begin(run_input, evaluations, children, learner_id)

In this order, as `TrainingRunWorkflow` issued them before this was its own module (the
recorded histories replay): the run's TemperedRunId upserted, `load_tasks` (a suite with no
training task left fails the run), the held-out tasks spread (`heldout_limit`), `prepare_run`
(version 0, the run's settings and held-out set recorded), version 0's evaluation started, the
learner counted in the run's pending children (before version 0's held-out tasks start) and
started as a `LearnerWorkflow` child that outlives continue-as-new (`ParentClosePolicy.ABANDON`).
What the run does next (rolling out, continuing as new) is not here.
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.workflow import ChildWorkflowHandle, ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from contracts.errors import ErrorType, fail
    from contracts.learner import LearnerDone, LearnerInput, PolicyVersion
    from contracts.names import Activity, Queue, SearchAttr
    from contracts.run import (
        HeldoutSet,
        LoadTasksRequest,
        LoadTasksResponse,
        PrepareRunRequest,
        TrainingRunInput,
        spread,
    )
    from workflows.activity_options import activity_options
    from workflows.budget import TASK_TIMEOUT
    from workflows.children import PendingChildren
    from workflows.evaluations import Evaluations
    from workflows.search import search_attribute_updates


async def begin(
    run_input: TrainingRunInput,
    evaluations: Evaluations,
    children: PendingChildren,
    learner_id: str,
) -> tuple[LoadTasksResponse, ChildWorkflowHandle[Any, dict[str, Any]]]:
    """The first segment's start: the suite, version 0 and its evaluation, the learner (its
    workflow id `learner_id`)."""
    workflow.upsert_search_attributes(
        search_attribute_updates({SearchAttr.RUN_ID: run_input.run_id})
    )
    tasks = await workflow.execute_activity(
        Activity.LOAD_TASKS.value,
        LoadTasksRequest(suite=run_input.suite),
        result_type=LoadTasksResponse,
        **activity_options(Activity.LOAD_TASKS, run_input.heartbeat_timeout_s),
    )
    if not tasks.train:
        raise fail(ErrorType.INVALID_TASK, f"suite {run_input.suite!r} has no training tasks left")
    evaluations.heldout = spread(tasks.heldout, run_input.heldout_limit)
    base = await workflow.execute_activity(
        Activity.PREPARE_RUN.value,
        PrepareRunRequest(
            run_id=run_input.run_id,
            base_model=run_input.base_model,
            run=run_input,
            heldout=HeldoutSet.of(evaluations.heldout),
        ),
        result_type=PolicyVersion,
        **activity_options(Activity.PREPARE_RUN, max(run_input.heartbeat_timeout_s, 120)),
    )
    evaluations.start(base.version)
    children.started()  # the learner, before version 0's held-out tasks
    learner: ChildWorkflowHandle[Any, dict[str, Any]] = await workflow.start_child_workflow(
        "LearnerWorkflow",  # by name, so that `result_type` applies (the same command)
        LearnerInput(
            run_id=run_input.run_id,
            config=run_input.grpo,
            max_steps=run_input.steps,
            parent_workflow_id=workflow.info().workflow_id,
            budget=run_input.budget,
            burst=run_input.concurrency,
        ),
        id=learner_id,
        result_type=dict,  # decoded by `child_final`: the learner may end on a newer build
        task_queue=Queue.AGENT_TASKS.value,
        parent_close_policy=ParentClosePolicy.ABANDON,  # it outlives continue-as-new
        task_timeout=TASK_TIMEOUT,
    )
    return tasks, learner


async def child_final(
    learner: ChildWorkflowHandle[Any, dict[str, Any]],
) -> LearnerInput:
    """The learner child's result, decoded as its `learner_done` signal is (fields a newer build
    added are ignored): the learner continues as new onto the newest build while this run stays
    on its own, and a strict decode of its result failed the run's workflow task for ever."""
    final = LearnerDone.model_validate({"final": await learner}).final
    assert final is not None
    return final
