"""End to end: `tempered up` on free ports, one worker process per queue, a task started with
the `temporal` CLI (no Python) and run to DONE, while its sandbox worker is SIGKILLed holding
the task's `execute` and replaced (tests/fixtures/drill.py proves from the history that the
execute ran again, as a later attempt, on the new worker). The task's history still holds its
`generate`, `execute` and `write_trajectories` activities and each FSM state it upserted, and
the visibility query finds it DONE: the one task proves what an undisturbed task run before
it proved, and that a task survives the kill. The workers are ready before the task starts: the
kill freezes the sandbox worker until the server hands it an execute, and a worker frozen while
it still starts has no poll open to be handed one (the drill would thaw it after 30 s)."""

from __future__ import annotations

import base64
import json
import uuid
from typing import TYPE_CHECKING

from contracts.names import Activity, Queue
from tests.fixtures.drill import Drill, kill_handed

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
    stack.wait_workers_ready()
    workflow_id = f"e2e-{uuid.uuid4().hex[:6]}"
    task_input = {
        "task": TASK,
        "run_id": "e2e",
        "group_size": 2,
        "max_turns": 2,
        "sampling": {"max_new_tokens": 16},
        "heartbeat_timeout_s": 5,
    }
    started = stack.start_task(workflow_id, task_input)
    assert started.returncode == 0, started.stderr

    # SIGKILL the sandbox worker holding the task's execute; a new one takes it over. Its
    # executes (programs the tiny model does not get to compile) take milliseconds, too short
    # to be caught running: the worker is frozen until the server hands it one.
    drill = Drill(stack, [workflow_id], timeout_s=240)
    drill.run([kill_handed(Queue.SANDBOX, Activity.EXECUTE)])
    assert drill.wait_closed(timeout_s=240) == {workflow_id: COMPLETED}
    figures = drill.verify()  # the execute it held completed as a later attempt on its replacement
    assert len(drill.kills) == 1 and figures["held_and_retried"], figures  # it hit one in flight

    history = stack.temporal("workflow", "show", "--workflow-id", workflow_id, "-o", "json").stdout
    for activity in ("generate", "execute", "write_trajectories"):
        assert f'"{activity}"' in history
    for state in ("GENERATE", "EXECUTE", "DONE"):  # upserted TemperedState values
        assert base64.b64encode(json.dumps(state).encode()).decode() in history, state
    done_query = f'WorkflowId = "{workflow_id}" AND TemperedState = "DONE"'
    stack.wait_for("the task listed as DONE", lambda: stack.count(done_query) == 1, 10)
    outcome = stack.result(workflow_id)
    assert len(outcome["rewards"]) == 2 and len(outcome["trajectories"]) == 2  # none twice
    assert len({t["key"] for t in outcome["trajectories"]}) == 2
