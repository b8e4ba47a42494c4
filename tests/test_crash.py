"""Crash tests: exactly-once trajectory accounting on S3 through SIGKILLed workers and restarted
servers, during a real tiny-preset training run (real processes, no mocks).

A `TrainingRunWorkflow` is started with the `temporal` CLI on a stack of its own; one
`tempered worker QUEUE` process per queue. While it runs: the sandbox worker is SIGKILLed while
it runs an `execute` and the rewards worker while it writes trajectories (each replaced by a
fresh process), SeaweedFS is stopped and started again, then the Temporal dev server (no worker
is restarted: they must reconnect on their own). SeaweedFS stays down until an activity attempt
has failed on it. Afterwards the histories show that each kill hit a running activity, which
then completed as a later attempt on the new worker, and that each activity that failed while
SeaweedFS was down completed as a later attempt; every task is DONE, exactly tasks × G
trajectories are stored, none twice, and the learner's acks list each one exactly once
(trained, skipped with its reason, or dropped as stale). Figures are printed (`pytest -s`) and
merged into bench/results.json["crash"].

    .venv/bin/pytest -m slow -s tests/test_crash.py
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from contracts.names import Activity, Queue
from tests.fixtures.drill import Drill, kill_mid, restart_seaweed, restart_temporal

if TYPE_CHECKING:
    from tests.fixtures.stack import Stack


STEPS = 4


@pytest.mark.slow
@pytest.mark.timeout(1200)  # several minutes on a loaded 2-core box
def test_killed_workers_and_restarted_servers_lose_and_duplicate_nothing(stack: Stack) -> None:
    started = time.monotonic()
    for queue in Queue:
        stack.start_worker(queue)
    run_id = "crash"
    workflow_id, tasks, group_size = stack.start_training(run_id, STEPS)
    drill = Drill(stack, [workflow_id], aim=(f"{run_id}-task-", workflow_id))
    drill.run(
        [
            kill_mid(Queue.SANDBOX, Activity.EXECUTE),
            kill_mid(Queue.REWARDS, Activity.WRITE_TRAJECTORIES),
            restart_seaweed(stack.progress_reached(workflow_id, tasks_done=3)),
            restart_temporal(stack.progress_reached(workflow_id, learner_steps=1)),
        ]
    )
    drill.check_training_run("crash", run_id, tasks, group_size, started)
