"""`LearnerWorkflow`: turns finished GRPO groups into policy versions, one `train_step` at a time.

Groups arrive by the `add_groups` signal (from the training run, or any client). The learner
takes `groups_per_step` of them per step, runs the `train_step` activity (queue `learner`) which
publishes policy version step+1, and records which tasks it consumed, so each group is trained on
exactly once: duplicates by task id are ignored, and the `consumed` set travels across
continue-as-new (every `steps_per_run` steps, or when the server suggests it). It ends after `max_steps`, or, once told `finish`, when its queue is drained.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contracts.learner import (
        LearnerInput,
        LearnerProgress,
        TrainStepRequest,
        TrainStepResponse,
        TrajectoryGroup,
    )
    from contracts.names import Activity, SearchAttr
    from workflows.activity_options import activity_options
    from workflows.search import search_attribute_updates


@workflow.defn(name="LearnerWorkflow")
class LearnerWorkflow:
    @workflow.init
    def __init__(self, learner_input: LearnerInput) -> None:
        self._state = learner_input
        self._seen = set(learner_input.consumed) | {g.task_id for g in learner_input.pending}
        self._finish = learner_input.finish_when_drained

    @workflow.run
    async def run(self, learner_input: LearnerInput) -> LearnerInput:
        state = self._state
        steps_this_run = 0
        while state.step < state.max_steps:
            await workflow.wait_condition(
                lambda: len(state.pending) >= state.config.groups_per_step or self._finish
            )
            if not state.pending:
                break
            batch = state.pending[: state.config.groups_per_step]
            response = await workflow.execute_activity(
                Activity.TRAIN_STEP.value,
                TrainStepRequest(
                    run_id=state.run_id, step=state.step, groups=batch, config=state.config
                ),
                result_type=TrainStepResponse,
                **activity_options(Activity.TRAIN_STEP, state.heartbeat_timeout_s),
            )
            del state.pending[: len(batch)]
            state.consumed.extend(g.task_id for g in batch)
            state.history.append(response)
            state.step += 1
            steps_this_run += 1
            workflow.upsert_search_attributes(
                search_attribute_updates(
                    {
                        SearchAttr.RUN_ID: state.run_id,
                        SearchAttr.POLICY_VERSION: response.policy.version,
                    }
                )
            )
            await self._report(state, response, batch)
            if state.step < state.max_steps and (
                steps_this_run >= state.steps_per_run
                or workflow.info().is_continue_as_new_suggested()
            ):
                await workflow.wait_condition(workflow.all_handlers_finished)
                state.finish_when_drained = self._finish
                workflow.continue_as_new(state)
        return state

    @workflow.signal(name="add_groups")
    def add_groups(self, groups: list[TrajectoryGroup]) -> None:
        self._enqueue(self._state, groups)

    @workflow.signal(name="finish")
    def finish(self) -> None:
        """Train on what is queued (a last partial batch included), then end."""
        self._finish = True

    @workflow.query(name="status")
    def status(self) -> LearnerInput:
        return self._state

    def _enqueue(self, state: LearnerInput, groups: list[TrajectoryGroup]) -> None:
        for group in groups:
            if group.task_id not in self._seen:  # a re-sent group is trained on once
                self._seen.add(group.task_id)
                state.pending.append(group)

    async def _report(
        self, state: LearnerInput, response: TrainStepResponse, batch: list[TrajectoryGroup]
    ) -> None:
        if state.parent_workflow_id is None:
            return
        parent = workflow.get_external_workflow_handle(state.parent_workflow_id)
        await parent.signal(
            "learner_progress",
            LearnerProgress(
                step=state.step,
                policy_version=response.policy.version,
                trained_groups=len(batch),
                reward_mean=response.reward_mean,
                loss=response.loss,
                dropped_stale=response.dropped_stale,
                staleness=state.step - 1 - min(g.policy_version for g in batch),
            ),
        )
