"""Load test: 1,000 agent tasks through the real dev server, sandbox and rewards workers.

The model is the only stand-in: a scripted `generate` worker in this process answers every
prompt with the canonical solution at once (`tests.workflows.harness.ScriptedModel`, run in a
thread pool), so the test measures the platform (Temporal, the workflow worker, bubblewrap
sandbox, S3 writes), not a model. Tasks are started from a client with bounded concurrency;
per-task latency is start → result, measured client-side. Reported: tasks/min, p50/p99 latency,
and what was lost. It fails when a task is lost (its workflow failed, or gave no result within
`TASK_DEADLINE_S`), is not DONE and solved, or its trajectories are not exactly G, none twice;
and when throughput falls below `FLOOR_TASKS_PER_MIN`. Starting stops after `BUDGET_S` so the
test ends within ~10 minutes on a small machine; reaching fewer than the 1,000 tasks then is a
warning (the rate is what the floor judges). Recorded under bench/results.json["load"];
TEMPERED_LOAD_TASKS=N runs a smaller load (not recorded, and not held to the floor: its rate is
mostly start-up).

    .venv/bin/pytest -m slow -s tests/test_load.py
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowFailureError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker

from contracts.names import Activity, Queue, Workflow
from contracts.rollout import AgentTaskResult, GenerateRequest, GenerateResponse
from contracts.task import AgentTaskInput, TaskSpec
from tests.accounting import account, record_results
from tests.workflows.harness import ScriptedModel

if TYPE_CHECKING:
    from tests.fixtures.stack import Stack


TASKS = int(os.environ.get("TEMPERED_LOAD_TASKS", "1000"))
GROUP_SIZE = 2
IN_FLIGHT = 48
BUDGET_S = 420.0
TASK_DEADLINE_S = 180.0
"""A task with no result this long after its start is lost (p99 latency here: see the report)."""
FLOOR_TASKS_PER_MIN = 60.0
"""Throughput floor: finished tasks per minute of wall time. Measured on the 2-core dev box
while other jobs kept its load average at ~14: 146 tasks/min (p50 18 s, p99 52 s, 1,000 of
1,000 tasks, none lost). 60 leaves a 2.4× margin for a slower or busier CI box; a regression
that costs more than that fails."""
SOLUTION = "def add(a, b):\n    return a + b\n"


def task_input(index: int) -> AgentTaskInput:
    task = TaskSpec(
        id=f"add-{index:04d}",
        prompt="Write add(a, b) returning a + b.",
        entry_point="add",
        tests="def check(candidate):\n    assert candidate(2, 3) == 5\n",
        canonical_solution=SOLUTION,
    )
    return AgentTaskInput(task=task, run_id="load", group_size=GROUP_SIZE, max_turns=1)


def scripted_generate(model: ScriptedModel) -> Any:
    """`model.generate` as a synchronous activity (its blocking S3 writes stay off the loop)."""

    @activity.defn(name=Activity.GENERATE.value)
    def generate(request: GenerateRequest) -> GenerateResponse:
        return asyncio.run(model.generate(request))

    return generate


@dataclass
class Drive:
    started: list[str] = field(default_factory=list)
    results: list[AgentTaskResult] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    lost: dict[str, str] = field(default_factory=dict)  # workflow id → what became of it
    wall_s: float = 0.0


async def drive(client: Client, tasks: int) -> Drive:
    """Start up to `tasks` tasks, `IN_FLIGHT` at a time, until `BUDGET_S`; wait for all."""
    gate = asyncio.Semaphore(IN_FLIGHT)
    out = Drive()
    started = time.monotonic()

    async def one(index: int) -> None:
        workflow_id = f"load-{index:04d}"
        try:
            begun = time.monotonic()
            handle = await client.start_workflow(
                Workflow.AGENT_TASK.value,
                task_input(index),
                id=workflow_id,
                task_queue=Queue.AGENT_TASKS.value,
                result_type=AgentTaskResult,
            )
            out.started.append(workflow_id)
            try:
                out.results.append(await asyncio.wait_for(handle.result(), TASK_DEADLINE_S))
            except TimeoutError:
                out.lost[workflow_id] = f"no result within {TASK_DEADLINE_S:.0f}s"
                return
            except WorkflowFailureError as exc:
                out.lost[workflow_id] = f"failed: {exc.cause}"
                return
            out.latencies.append(time.monotonic() - begun)
        finally:
            gate.release()

    jobs = []
    for index in range(tasks):
        await gate.acquire()
        if time.monotonic() - started > BUDGET_S:
            gate.release()
            break
        jobs.append(asyncio.create_task(one(index)))
    await asyncio.gather(*jobs)
    out.wall_s = time.monotonic() - started
    return out


@pytest.mark.slow
@pytest.mark.timeout(BUDGET_S + TASK_DEADLINE_S + 240)  # + start-up and teardown
@pytest.mark.asyncio
async def test_a_thousand_trivial_tasks(stack: Stack) -> None:
    for queue in (Queue.AGENT_TASKS, Queue.SANDBOX, Queue.REWARDS):
        stack.start_worker(queue)
    stack.wait_workers_ready()
    model = ScriptedModel(stack.store(), lambda sample, turn: SOLUTION)
    client = await Client.connect(
        stack.settings.temporal.address, data_converter=pydantic_data_converter
    )
    with ThreadPoolExecutor(max_workers=16) as pool:
        async with Worker(
            client,
            task_queue=Queue.INFERENCE.value,
            activities=[scripted_generate(model)],
            activity_executor=pool,
            max_concurrent_activities=16,
        ):
            run = await drive(client, TASKS)

    ledger = await asyncio.to_thread(
        account, stack.store(), "load", tasks=len(run.started), group_size=GROUP_SIZE, acks=False
    )
    ledger.print("load")
    cut = sorted(run.latencies) or [0.0]
    done = len(run.results)
    figures = {
        "tasks_target": TASKS,
        "budget_s": BUDGET_S,
        "tasks_started": len(run.started),
        "tasks_done": done,
        "tasks_lost": len(run.lost),
        "group_size": GROUP_SIZE,
        "in_flight": IN_FLIGHT,
        "wall_s": round(run.wall_s, 1),
        "tasks_per_s": round(done / run.wall_s, 2),
        "tasks_per_min": round(60 * done / run.wall_s, 1),
        "floor_tasks_per_min": FLOOR_TASKS_PER_MIN,
        "latency_p50_s": round(statistics.median(cut), 2),
        "latency_p99_s": round(cut[min(len(cut) - 1, int(0.99 * len(cut)))], 2),
        "trajectories_expected": ledger.expected,
        "trajectories_stored": ledger.stored,
        "duplicates": ledger.duplicates,
    }
    print(f"[load] {figures}")
    if "TEMPERED_LOAD_TASKS" not in os.environ:  # only the full load is recorded
        record_results("load", figures)
    assert not run.lost, f"{len(run.lost)} tasks lost: {dict(list(run.lost.items())[:5])}"
    assert all(r.state == "DONE" and all(r.solved) for r in run.results)
    assert len({r.task_id for r in run.results}) == done == len(run.started)
    ledger.assert_stored_once()
    if "TEMPERED_LOAD_TASKS" not in os.environ:  # a small load's rate is mostly its start-up
        assert figures["tasks_per_min"] >= FLOOR_TASKS_PER_MIN, (
            f"throughput {figures['tasks_per_min']} tasks/min is below the floor of "
            f"{FLOOR_TASKS_PER_MIN} tasks/min"
        )
    if len(run.started) < TASKS:  # a slow (shared) machine: the floor judges the rate
        warnings.warn(
            f"load: {len(run.started)} of {TASKS} tasks within the {BUDGET_S:.0f}s budget "
            f"({figures['tasks_per_min']} tasks/min)",
            stacklevel=1,
        )
