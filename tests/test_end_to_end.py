"""End to end: `tempered up` on free ports, one worker process per queue, a task started with
the `temporal` CLI (no Python), run to DONE; then a worker is SIGKILLed mid-task and replaced."""

from __future__ import annotations

import base64
import json
import signal
import uuid
from typing import TYPE_CHECKING

from contracts.names import Queue

if TYPE_CHECKING:
    from tests.fixtures.stack import Stack

TASK = {
    "id": "e2e-add",
    "prompt": "Write a Python function add(a, b) that returns a + b.",
    "entry_point": "add",
    "tests": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
}


COMPLETED = "WORKFLOW_EXECUTION_STATUS_COMPLETED"


def test_cli_started_task_runs_to_done_and_survives_a_killed_worker(stack: Stack) -> None:
    for queue in Queue:
        stack.start_worker(queue)
    workflow_id = f"e2e-{uuid.uuid4().hex[:6]}"
    task_input = {
        "task": TASK,
        "run_id": "e2e",
        "group_size": 2,
        "max_turns": 2,
        "sampling": {"max_new_tokens": 16},
        "heartbeat_timeout_s": 5,
    }
    started = stack.temporal(
        "workflow",
        "start",
        "--task-queue",
        "agent-tasks",
        "--type",
        "AgentTaskWorkflow",
        "--workflow-id",
        workflow_id,
        "--input",
        json.dumps(task_input),
    )
    assert started.returncode == 0, started.stderr
    assert stack.wait_closed(workflow_id, timeout_s=240) == COMPLETED
    history = stack.temporal("workflow", "show", "--workflow-id", workflow_id, "-o", "json").stdout
    for activity in ("generate", "execute", "write_trajectories"):
        assert f'"{activity}"' in history
    for state in ("GENERATE", "EXECUTE", "DONE"):  # upserted TemperedState values
        assert base64.b64encode(json.dumps(state).encode()).decode() in history, state
    done_query = f'WorkflowId = "{workflow_id}" AND TemperedState = "DONE"'
    stack.wait_for("the task listed as DONE", lambda: stack.count(done_query) == 1, 10)

    # SIGKILL the sandbox worker while a second task runs; a new one takes over.
    second = f"{workflow_id}-kill"
    task_input["task"] = {**TASK, "id": "e2e-add-2"}
    assert (
        stack.temporal(
            "workflow",
            "start",
            "--task-queue",
            "agent-tasks",
            "--type",
            "AgentTaskWorkflow",
            "--workflow-id",
            second,
            "--input",
            json.dumps(task_input),
        ).returncode
        == 0
    )
    stack.workers[Queue.SANDBOX].send_signal(signal.SIGKILL)
    stack.workers[Queue.SANDBOX].wait(10)
    running = stack.temporal("workflow", "describe", "--workflow-id", second, "-o", "json")
    assert "WORKFLOW_EXECUTION_STATUS_RUNNING" in running.stdout  # killed mid-task
    stack.wait_for(  # EXECUTE is waiting for a sandbox worker
        "a pending execute", stack.activity_pending(second, "execute"), 120, poll_s=0.2
    )
    stack.start_worker(Queue.SANDBOX)
    assert stack.wait_closed(second, timeout_s=240) == COMPLETED
    outcome = stack.result(second)
    assert len(outcome["rewards"]) == 2 and len(outcome["trajectories"]) == 2  # none twice
    assert len({t["key"] for t in outcome["trajectories"]}) == 2
