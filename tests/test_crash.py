"""Crash tests: exactly-once trajectory accounting on S3 through SIGKILLed workers and restarted
servers, during a real tiny-preset training run (real processes, no mocks).

A `TrainingRunWorkflow` is started with the `temporal` CLI on a stack of its own; one
`tempered worker QUEUE` process per queue. While it runs: the sandbox and rewards workers are
SIGKILLed mid-task and restarted, SeaweedFS is stopped and started again, then the Temporal dev
server (workers keep running and must reconnect on their own). Afterwards every task is DONE,
exactly tasks × G trajectories are stored, none twice, and the learner's acks list each one
exactly once. Figures are printed (`pytest -s`) and merged into bench/results.json["crash"].

    .venv/bin/pytest -m slow -s tests/test_crash.py
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from contracts.names import Queue
from tests.accounting import check_training_run

if TYPE_CHECKING:
    from tests.fixtures.stack import Fault, Stack


STEPS = 4


@pytest.mark.slow
def test_killed_workers_and_restarted_servers_lose_and_duplicate_nothing(stack: Stack) -> None:
    started = time.monotonic()
    for queue in Queue:
        stack.start_worker(queue)
    run_id = "crash"
    workflow_id, tasks, group_size = stack.start_training(run_id, STEPS)

    def kill_sandbox_and_rewards() -> None:
        stack.kill_worker(Queue.SANDBOX)
        stack.kill_worker(Queue.REWARDS)
        time.sleep(1)
        stack.start_worker(Queue.SANDBOX)
        stack.start_worker(Queue.REWARDS)

    faults: list[Fault] = [
        (
            "SIGKILL sandbox+rewards workers mid-EXECUTE",
            stack.tasks_in_state(run_id, "EXECUTE"),
            kill_sandbox_and_rewards,
        ),
        (
            "restart SeaweedFS",
            stack.progress_reached(workflow_id, tasks_done=2),
            lambda: stack.restart_seaweed(down_s=3),
        ),
        (
            "restart the Temporal dev server",
            stack.progress_reached(workflow_id, learner_steps=1),
            lambda: stack.restart_temporal(down_s=3),
        ),
    ]
    log = stack.drill(workflow_id, faults)
    check_training_run(stack, "crash", workflow_id, run_id, tasks, group_size, log, started)
