"""Chaos test: every worker type SIGKILLed in turn, then the Temporal dev server and SeaweedFS
restarted, during one real tiny-preset training run (real processes and servers, no mocks).

Each worker is killed while it has work in hand (inference mid-GENERATE, sandbox mid-EXECUTE,
the workflow worker while tasks run, rewards while trajectories are written, the learner during
`train_step`) and a fresh process takes its place. Afterwards: the run completed, every task
reached DONE, tasks × G trajectories are stored, none twice, each trained on exactly once
(learner acks). Figures go to stdout (`-s`) and bench/results.json["chaos"].

    .venv/bin/pytest -m slow -s tests/test_chaos.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from contracts.names import Queue
from tests.accounting import check_training_run

if TYPE_CHECKING:
    from tests.fixtures.stack import Fault, Stack


STEPS = 5


def either(*triggers: Callable[[], bool]) -> Callable[[], bool]:
    return lambda: any(trigger() for trigger in triggers)


@pytest.mark.slow
def test_every_worker_killed_and_servers_restarted_mid_run(stack: Stack) -> None:
    started = time.monotonic()
    for queue in Queue:
        stack.start_worker(queue)
    run_id = "chaos"
    workflow_id, tasks, group_size = stack.start_training(run_id, STEPS)
    learner_id = f"{workflow_id}-learner"

    def kill(queue: Queue) -> Callable[[], None]:
        return lambda: stack.restart_worker(queue)

    # The learner goes first: its first train_step (engine start-up) is the long one; later
    # steps on the tiny model have no signal (equal rewards) and take milliseconds.
    faults: list[Fault] = [
        (
            "SIGKILL learner mid-train_step",
            stack.activity_pending(learner_id, "train_step"),
            kill(Queue.LEARNER),
        ),
        (
            "SIGKILL inference mid-GENERATE",
            stack.tasks_in_state(run_id, "GENERATE"),
            kill(Queue.INFERENCE),
        ),
        (
            "SIGKILL sandbox mid-EXECUTE",
            stack.tasks_in_state(run_id, "EXECUTE"),
            kill(Queue.SANDBOX),
        ),
        (
            "SIGKILL agent-tasks (workflow worker)",
            stack.tasks_in_state(run_id, "GENERATE"),
            kill(Queue.AGENT_TASKS),
        ),
        (
            "SIGKILL rewards while trajectories are written",
            either(
                stack.tasks_in_state(run_id, "DONE"),
                stack.progress_reached(workflow_id, tasks_done=3),
            ),
            kill(Queue.REWARDS),
        ),
        (
            "restart SeaweedFS",
            stack.progress_reached(workflow_id, learner_steps=1),
            lambda: stack.restart_seaweed(down_s=3),
        ),
        (
            "restart the Temporal dev server",
            stack.progress_reached(workflow_id, learner_steps=2),
            lambda: stack.restart_temporal(down_s=3),
        ),
    ]
    log = stack.drill(workflow_id, faults, timeout_s=400)
    check_training_run(stack, "chaos", workflow_id, run_id, tasks, group_size, log, started)
