"""End to end: `tempered up` on free ports, one worker process per queue, a task started with
the `temporal` CLI (no Python), run to DONE; then a worker is SIGKILLed mid-task and replaced."""

from __future__ import annotations

import base64
import json
import signal
import time
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


def wait_done(stack: Stack, workflow_id: str, timeout_s: float = 240) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = stack.temporal("workflow", "describe", "--workflow-id", workflow_id, "-o", "json")
        if out.returncode == 0:
            described = json.loads(out.stdout)
            status = described["workflowExecutionInfo"]["status"]
            if status != "WORKFLOW_EXECUTION_STATUS_RUNNING":
                return described
        time.sleep(1)
    logs = "\n".join(
        f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        for log in sorted(stack.home.glob("worker-*.log"))
    )
    raise AssertionError(f"{workflow_id} not finished after {timeout_s}s; worker logs:\n{logs}")


def wait_pending(stack: Stack, workflow_id: str, activity: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = stack.temporal("workflow", "describe", "--workflow-id", workflow_id, "-o", "json")
        pending = json.loads(out.stdout or "{}").get("pendingActivities", [])
        if any(p.get("activityType", {}).get("name") == activity for p in pending):
            return
        time.sleep(0.2)
    raise AssertionError(f"{workflow_id}: no pending {activity} activity after {timeout_s}s")


def listed(stack: Stack, query: str) -> list[str]:
    """Workflow ids matching a visibility query (retried: visibility is eventually consistent)."""
    for _ in range(20):
        out = stack.temporal("workflow", "list", "--query", query, "-o", "json")
        ids = [w["execution"]["workflowId"] for w in json.loads(out.stdout or "[]")]
        if ids:
            return ids
        time.sleep(0.5)
    return []


def test_cli_started_task_runs_to_done_and_survives_a_killed_worker(stack: Stack) -> None:
    for queue in Queue:
        stack.start_worker(queue)
    workflow_id = f"e2e-{uuid.uuid4().hex[:6]}"
    task_input = {"task": TASK, "run_id": "e2e", "group_size": 2, "max_turns": 2,
                  "sampling": {"max_new_tokens": 16}, "heartbeat_timeout_s": 5}
    started = stack.temporal(
        "workflow", "start", "--task-queue", "agent-tasks", "--type", "AgentTaskWorkflow",
        "--workflow-id", workflow_id, "--input", json.dumps(task_input),
    )
    assert started.returncode == 0, started.stderr
    described = wait_done(stack, workflow_id)
    assert described["workflowExecutionInfo"]["status"] == "WORKFLOW_EXECUTION_STATUS_COMPLETED"
    history = stack.temporal("workflow", "show", "--workflow-id", workflow_id, "-o", "json").stdout
    for activity in ("generate", "execute", "write_trajectories"):
        assert f'"{activity}"' in history
    for state in ("GENERATE", "EXECUTE", "FEEDBACK", "DONE"):  # upserted TemperedState values
        assert base64.b64encode(json.dumps(state).encode()).decode() in history, state
    assert listed(stack, f'WorkflowId = "{workflow_id}" AND TemperedState = "DONE"') == [workflow_id]

    # SIGKILL the sandbox worker while a second task runs; a new one takes over.
    second = f"{workflow_id}-kill"
    task_input["task"] = {**TASK, "id": "e2e-add-2"}
    assert stack.temporal(
        "workflow", "start", "--task-queue", "agent-tasks", "--type", "AgentTaskWorkflow",
        "--workflow-id", second, "--input", json.dumps(task_input),
    ).returncode == 0
    stack.workers[Queue.SANDBOX].send_signal(signal.SIGKILL)
    stack.workers[Queue.SANDBOX].wait(10)
    running = stack.temporal("workflow", "describe", "--workflow-id", second, "-o", "json")
    assert "WORKFLOW_EXECUTION_STATUS_RUNNING" in running.stdout  # killed mid-task
    wait_pending(stack, second, "execute")  # EXECUTE is waiting for a sandbox worker
    stack.start_worker(Queue.SANDBOX)
    described = wait_done(stack, second)
    assert described["workflowExecutionInfo"]["status"] == "WORKFLOW_EXECUTION_STATUS_COMPLETED"
    result = stack.temporal("workflow", "result", "--workflow-id", second, "-o", "json")
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)["result"]
    assert len(outcome["rewards"]) == 2 and len(outcome["trajectories"]) == 2  # none twice
    assert len({t["key"] for t in outcome["trajectories"]}) == 2
