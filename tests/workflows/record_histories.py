"""Record the histories tests/workflows/test_replay.py replays: run this on a release's code and
commit what it writes as the next release's "previous release" histories.

    git worktree add /tmp/release <release>
    cd /tmp/release && python -m tests.workflows.record_histories tests/workflows/histories/

It runs, on a dev server of its own and a SeaweedFS of its own, with the scripted activities of
tests/workflows/control_plane.py: a training run of 6 tasks (3 learner steps of 2 groups, evals
at v0, v2, v3) and a learner that continues as new after 2 steps, and writes
`training_run.json`, `learner_child.json` (that run's learner), `learner.json` (the first run
of the other) and `learner_next.json` (the run it continued as: committed as
`learner_write_first*.json` from the release that writes a segment's ledger in the next) and
`learner_cancelled.json` (a learner cancelled while it waits for groups, whose run is gone); with `--redraw` only `training_run_redraw.json`: a run of the same shape whose
suite has flat groups and which redraws two of them (dynamic sampling; committed as
`training_run_spread.json` too, recorded once the redraws were spread); with `--tails` only
`training_run_tails.json` and `training_run_tails_next.json`, a run of 12 tasks on a 200-event
budget, which continues as new once, and its learner's `learner_look_ahead.json` (recorded once
both looked ahead at their next input's size now: patches `…-look-ahead-bytes`;
`training_run_tails_next.json` again as `training_run_ending.json` once the run's ending
counted the learner's reported state: patch `tempered-run-ending-bytes`).
`agent_task.json` comes from test_agent_task.py (`TEMPERED_RECORD_HISTORIES=1`), as the other
agent-task histories come from their tests: `agent_task_trajectory_parts.json.gz` and
`agent_task_trajectories_whole.json.gz` (gzipped: 3 MB of JSON each) from test_replay_parts.py,
`agent_task_code_feedback.json` and `agent_task_code_before_feedback.json` from
test_agent_task_code_feedback.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
from pathlib import Path

from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter

from contracts.common import ObjectRef
from contracts.learner import GRPOConfig, HistoryBudget, LearnerInput, TrajectoryGroup
from contracts.names import Queue
from contracts.run import TrainingRunInput
from infra.storage import ObjectStore
from tests.fixtures.s3 import SeaweedServer
from tests.fixtures.temporal import start_dev_server
from tests.workflows.control_plane import (
    ScriptedSuite,
    ScriptedTrainer,
    control_plane,
    run_histories,
)
from workflows.learner import LearnerWorkflow
from workflows.training_run import TrainingRunWorkflow

REF = ObjectRef(key="k", size=1, sha256="0" * 64)
RUN = TrainingRunInput(
    run_id="replay-run",
    steps=3,
    group_size=2,
    concurrency=3,
    eval_every=2,
    grpo=GRPOConfig(groups_per_step=2, max_staleness=1),
)


def group(task: str) -> TrajectoryGroup:
    return TrajectoryGroup(task_id=task, trajectories=[REF], rewards=[1.0], policy_version=0)


async def record_redraw(out: Path, client: Client, store: ObjectStore) -> None:
    """A training run that redraws 2 of its flat groups (every other task of 5 is flat)."""
    suite, trainer = ScriptedSuite(train=5, heldout=2, flat_every=2), ScriptedTrainer()
    grpo = RUN.grpo.model_copy(update={"redraw_flat_groups": 2})
    redraw = RUN.model_copy(update={"run_id": "replay-redraw", "grpo": grpo})
    async with control_plane(client, store, suite, trainer):
        run = await client.start_workflow(
            TrainingRunWorkflow.run, redraw, id="train-replay-redraw", task_queue=Queue.AGENT_TASKS
        )
        result = await run.result()
        assert result.redrawn == 2, result
        (out / "training_run_redraw.json").write_text((await run.fetch_history()).to_json())


async def record_tails(out: Path, client: Client, store: ObjectStore) -> None:
    """A training run that continues as new on its history budget, once."""
    suite, trainer = ScriptedSuite(train=5, heldout=2), ScriptedTrainer()
    long = RUN.model_copy(
        update={"run_id": "replay-tails", "steps": 6, "budget": HistoryBudget(events=200)}
    )
    async with control_plane(client, store, suite, trainer):
        run = await client.start_workflow(
            TrainingRunWorkflow.run, long, id="train-replay-tails", task_queue=Queue.AGENT_TASKS
        )
        await run.result()
        first, then = await run_histories(client, run.id)
        (out / "training_run_tails.json").write_text(first.to_json())
        (out / "training_run_tails_next.json").write_text(then.to_json())
        learner = await client.get_workflow_handle(f"{run.id}-learner").fetch_history()
        (out / "learner_look_ahead.json").write_text(learner.to_json())


async def record(out: Path, client: Client, store: ObjectStore) -> None:
    suite, trainer = ScriptedSuite(train=5, heldout=2), ScriptedTrainer()
    async with control_plane(client, store, suite, trainer):
        run = await client.start_workflow(
            TrainingRunWorkflow.run, RUN, id="train-replay-run", task_queue=Queue.AGENT_TASKS
        )
        await run.result()
        (out / "training_run.json").write_text((await run.fetch_history()).to_json())
        child = client.get_workflow_handle(f"{run.id}-learner")
        (out / "learner_child.json").write_text((await child.fetch_history()).to_json())

        learner = await client.start_workflow(
            LearnerWorkflow.run,
            LearnerInput(
                run_id="replay-learner",
                config=GRPOConfig(groups_per_step=2),
                max_steps=10,
                steps_per_run=2,
            ),
            id="replay-learner",
            task_queue=Queue.AGENT_TASKS,
        )
        first_run = learner.first_execution_run_id
        await learner.signal(LearnerWorkflow.add_groups, [group("a"), group("b"), group("a")])
        await learner.signal(LearnerWorkflow.add_groups, [group("c"), group("b")])
        await learner.signal(LearnerWorkflow.add_groups, [group("d"), group("e")])
        await learner.signal(LearnerWorkflow.finish)
        await learner.result()
        first = client.get_workflow_handle(learner.id, run_id=first_run)
        (out / "learner.json").write_text((await first.fetch_history()).to_json())
        (out / "learner_next.json").write_text((await learner.fetch_history()).to_json())

        cancelled = await client.start_workflow(
            LearnerWorkflow.run,
            LearnerInput(
                run_id="replay-cancel",
                config=GRPOConfig(groups_per_step=2),
                parent_workflow_id="train-gone",  # no such run: its learner_done fails, once
            ),
            id="replay-learner-cancel",
            task_queue=Queue.AGENT_TASKS,
        )
        await cancelled.signal(LearnerWorkflow.add_groups, [group("a")])  # a waits for a partner
        await cancelled.cancel()
        with contextlib.suppress(WorkflowFailureError):
            await cancelled.result()
        (out / "learner_cancelled.json").write_text((await cancelled.fetch_history()).to_json())


async def main(out: Path, which: str) -> None:
    recorder = {"--redraw": record_redraw, "--tails": record_tails}.get(which, record)
    server = start_dev_server()
    try:
        client = await Client.connect(
            server.address, namespace="test-0", data_converter=pydantic_data_converter
        )
        with tempfile.TemporaryDirectory() as tmp:
            seaweed = SeaweedServer(Path(tmp))
            seaweed.start()
            try:
                await recorder(out, client, seaweed.store())
            finally:
                seaweed.stop()
    finally:
        server.process.terminate()
        server.process.wait(15)


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), (sys.argv[2:] or [""])[0]))
