"""Safe upgrades: the histories the previous release recorded replay on this code, and a change
to a workflow's command sequence is caught here unless it is behind `workflow.patched`.

The histories under histories/ are the previous release's: `agent_task.json` from its
tests/workflows/test_agent_task.py, the others from a training run of 6 tasks (3 learner steps,
evals at v0, v2, v3) and a learner that continued as new, run with the scripted activities of
tests/workflows/control_plane.py on the code of that release (`git worktree add … <release>`,
then `python -m tests.workflows.record_histories histories/` there); `training_run_redraw.json`
(a run that redrew flat groups: `… histories/ --redraw`) on the release that added redraws.
Running workflows of an old build finish on that build (worker versioning pins them, see
workers/runtime.py); these tests cover what versioning does not: workflows started before it,
and in-place patches.
"""

from __future__ import annotations

import gzip
import json
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHistory

from contracts.learner import LearnerInput, TrajectoryGroup
from tests.workflows.replaying import replay
from workflows.agent_task import AgentTaskWorkflow
from workflows.learner import LearnerWorkflow
from workflows.training_run import TrainingRunWorkflow

HISTORIES = Path(__file__).parent / "histories"
RECORDED: dict[str, tuple[type, str]] = {  # file → (workflow, the id it ran under)
    "agent_task.json": (AgentTaskWorkflow, "agent-task"),
    # a workspace group recorded before its untouched workspace was verified beside the final
    # ones (the current code's is tests/workflows/histories/agent_task_workspace.json)
    "agent_task_workspace_before_untouched.json": (AgentTaskWorkflow, "ws-43fd11-fix"),
    # recorded on the release whose failing step stops its other queues' steps (its patch
    # marker): tests/workflows/test_sessions_stop.py with TEMPERED_RECORD_HISTORIES=1, worker
    # a's step failing while b's runs (cancelled and waited for, then the sessions closed)
    "agent_task_workspace_stopped.json": (AgentTaskWorkflow, "stop-1e5f2c-fix"),
    # recorded on the release whose first open waits for a cancel (its patch marker):
    # tests/workflows/test_sessions_open_cancel.py with TEMPERED_RECORD_HISTORIES=1, a task
    # cancelled once its open had opened the sessions, which it closed; in `…_raced` the
    # open's result came in the cancel's own workflow task
    "agent_task_workspace_open_cancelled.json": (AgentTaskWorkflow, "open-933b35-fix"),
    "agent_task_workspace_open_raced.json": (AgentTaskWorkflow, "open-cfbb1b-fix"),
    "learner.json": (LearnerWorkflow, "replay-learner"),  # two steps, then continue-as-new
    # a training run's learner (progress signals, finish) and the run (children, evals)
    "learner_child.json": (LearnerWorkflow, "train-replay-run-learner"),
    "training_run.json": (TrainingRunWorkflow, "train-replay-run"),
    # recorded on the release that added dynamic sampling: a run that redrew 2 flat groups
    "training_run_redraw.json": (TrainingRunWorkflow, "train-replay-redraw"),
    # recorded on the release that spread the redraws over the steps (its patch marker)
    "training_run_spread.json": (TrainingRunWorkflow, "train-replay-redraw"),
    # recorded on the release whose look-ahead counts the next input at its size now (their
    # patch markers): a run that continued as new on its budget, both segments, and its learner
    "training_run_tails.json": (TrainingRunWorkflow, "train-replay-tails"),
    "training_run_tails_next.json": (TrainingRunWorkflow, "train-replay-tails"),
    "learner_look_ahead.json": (LearnerWorkflow, "train-replay-tails-learner"),
    # recorded on the release whose run's ending counts the learner's reported state once a
    # copy (its patch marker): the second segment of that run (`--tails`' `…_tails_next.json`)
    "training_run_ending.json": (TrainingRunWorkflow, "train-replay-tails"),
    # recorded on the release that writes a segment's ledger in the next segment (its patch
    # marker): the learner's first run, and the run it continued as (which writes it first)
    "learner_write_first.json": (LearnerWorkflow, "replay-learner"),
    "learner_write_first_next.json": (LearnerWorkflow, "replay-learner"),
    # recorded on the release that keeps a spent cancellation: cancelled while it waits, it
    # tells its (gone) run once and ends cancelled
    "learner_cancelled.json": (LearnerWorkflow, "replay-learner-cancel"),
    # recorded on the release whose cancelled learner waits for its step to stop (its patch
    # marker): tests/workflows/test_learner.py with TEMPERED_RECORD_HISTORIES=1
    "learner_cancelled_in_step.json": (LearnerWorkflow, "learner-cancelled-in-a-step"),
    # recorded on the release whose runs' tasks are cancelled, not terminated, when the run
    # closes early, and whose run fails at once on a failed task, held-out task or unreachable
    # learner (their patch markers): tests/workflows/test_training_run_children.py (stand-in
    # tasks that wait to be cancelled) and test_training_run_fails_at_once.py with
    # TEMPERED_RECORD_HISTORIES=1; a run cancelled with its tasks in flight, one whose task
    # failed, one whose held-out task failed as it waited for its last tasks, and one whose
    # learner was terminated (its signals failed after their retries)
    "training_run_children_cancelled.json": (TrainingRunWorkflow, "train-early-cancelled"),
    "training_run_task_failed.json": (TrainingRunWorkflow, "train-early-fails"),
    "training_run_held_out_failed.json": (TrainingRunWorkflow, "train-early-held-out-fails"),
    "training_run_learner_lost.json": (TrainingRunWorkflow, "train-learner-lost"),
    # recorded on the release whose run probes its learner while nothing is in flight (its
    # patch marker): test_training_run_fails_at_once.py, a learner terminated in its first step
    "training_run_learner_probed.json": (TrainingRunWorkflow, "train-learner-idle"),
    # recorded on the release whose run sends each group in time for its learner step (its
    # patch marker): tests/workflows/test_training_run_order.py with TEMPERED_RECORD_HISTORIES=1,
    # a slow task's group held back the next step's four, sent after it in one signal
    "training_run_ordered.json": (TrainingRunWorkflow, "train-order"),
    # recorded on the release whose run retries its learner's cancel (a cancel run and then a
    # learner started under its id: test_run_fix60_learner_cancel.py) and whose run sends flat
    # groups finishing past its time budget (test_run_fix60_budget_flat.py); their markers
    "training_run_learner_cancel_retried.json": (TrainingRunWorkflow, "train-cancel-retried"),
    "training_run_budget_sends_flat.json": (TrainingRunWorkflow, "train-flat-budget"),
    # recorded on a later release (the same patch marker): a run in that order that redrew 5
    # flat groups and drained held groups to continue as new, both its segments
    # (tests/workflows/test_replay_ordered.py's `test_record`, TEMPERED_RECORD_HISTORIES=1)
    "training_run_ordered_redraws.json": (TrainingRunWorkflow, "train-order-5"),
    "training_run_ordered_redraws_1.json": (TrainingRunWorkflow, "train-order-5"),
    # recorded on the release whose carry made one round (b0cf1ee): step 0's 2 parts, its
    # `train_step`, at `max_steps` the 3 groups left pending stored in 2 parts while 3 more
    # (~1.35 MB) were signalled, which went inline in the ledger write's, `learner_done`'s and
    # result's turn; its continuing-as-new twin (`…_one_round_before`) is unsupported
    # (tests/workflows/test_learner_carry_replay61.py, workflows/learner_carry.py)
    "learner_carry_one_round_end_before.json.gz": (LearnerWorkflow, "r1-carry-end-old"),
    # recorded on the release whose carry looped under `CARRY_PARTS_PATCH` alone (cc5559e): the
    # same runs, 5 groups (~2.25 MB) signalled during the first round, stored in 3 more parts by
    # a second round with no marker of its own; before its continue-as-new, and at `max_steps`
    # after the ledger write (test_learner_carry_replay61.py)
    "learner_carry_rounds_cc5559e.json.gz": (LearnerWorkflow, "carry-rounds-old"),
    "learner_carry_rounds_end_cc5559e.json.gz": (LearnerWorkflow, "carry-rounds-end-old"),
}


def recorded(name: str) -> WorkflowHistory:
    """`name`'s history; gzipped where it ends in `.gz` (a large one: its groups repeat)."""
    workflow_id = RECORDED[name][1]
    data = (HISTORIES / name).read_bytes()
    text = gzip.decompress(data) if name.endswith(".gz") else data
    return WorkflowHistory.from_json(workflow_id, json.loads(text))


@pytest.mark.asyncio
@pytest.mark.parametrize("name", sorted(RECORDED))
async def test_previous_release_replays(name: str) -> None:
    await replay(recorded(name), RECORDED[name][0])


class _OneMoreTimer(LearnerWorkflow):
    """The learner with a timer before every batch: one more command per step."""

    async def _unconsumed_batch(self) -> list[TrajectoryGroup] | None:
        if self.patch is None or workflow.patched(self.patch):
            await workflow.sleep(timedelta(seconds=1))
        return await super()._unconsumed_batch()

    patch: str | None = None


@workflow.defn(name="LearnerWorkflow")
class UnpatchedLearner(_OneMoreTimer):
    @workflow.run
    async def run(self, learner_input: LearnerInput) -> LearnerInput:
        return await super().run(learner_input)


@workflow.defn(name="LearnerWorkflow")
class PatchedLearner(_OneMoreTimer):
    patch = "timer-before-batch"

    @workflow.run
    async def run(self, learner_input: LearnerInput) -> LearnerInput:
        return await super().run(learner_input)


@pytest.mark.asyncio
async def test_changed_commands_fail_the_replay_unless_patched() -> None:
    with pytest.raises(workflow.NondeterminismError, match="(?i)timer|activity|nondetermin"):
        await replay(recorded("learner.json"), UnpatchedLearner)
    await replay(recorded("learner.json"), PatchedLearner)
