"""A parent workflow for the benches: agent tasks run as its children, the way a training run
runs them.

    turns = await run_as_children(client, inputs, concurrency, name)   # one parent, its children

`TrainingRunWorkflow` runs every agent task through `workflows.agent_task.run_agent_task`: a
child workflow (no eager start: it waits in the agent-tasks queue for a poll), whose start and
completion are events and workflow tasks of the parent too. `TaskParent` calls that very
function for each input, at most `concurrency` in flight, and returns each task's turns, so a
bench measures what the pipeline pays for a task. What it leaves out of a run's own work:
drawing tasks, sending groups to the learner, the look-ahead and the progress it keeps (the
workflow tasks those take are the run's, not a task's). It runs in the SDK's sandbox, as the
training run does, on a queue of its own (`PARENT_QUEUE`): the production agent-tasks worker
registers no bench workflow, and a second worker on its queue would take its tasks.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contracts.common import Contract
    from contracts.names import task_workflow_id
    from contracts.task import AgentTaskInput
    from workflows.agent_task import run_agent_task

PARENT_QUEUE = "bench-task-parent"
PATH = (
    "each task an AgentTaskWorkflow child of a parent workflow, as TrainingRunWorkflow runs it "
    "(run_agent_task: no eager start)"
)
"""What the Temporal side measures, as the benches print it."""


class ParentInput(Contract):
    inputs: list[AgentTaskInput]
    concurrency: int


@workflow.defn(name="BenchTaskParent")
class TaskParent:
    @workflow.run
    async def run(self, job: ParentInput) -> list[int]:
        slots = asyncio.Semaphore(job.concurrency)

        async def one(task_input: AgentTaskInput) -> int:
            async with slots:
                task_id = task_workflow_id(task_input.run_id, task_input.task.id)
                result = await run_agent_task(task_input, task_id)
            return int(result.turns)

        return list(await asyncio.gather(*(one(i) for i in job.inputs)))


async def run_as_children(
    client: Any, inputs: list[AgentTaskInput], concurrency: int, name: str
) -> list[int]:
    """The tasks as children of one TaskParent (workflow id `<name>-parent`, on `PARENT_QUEUE`),
    `concurrency` in flight; each one's turns."""
    turns = await client.execute_workflow(
        TaskParent.run,
        ParentInput(inputs=inputs, concurrency=concurrency),
        id=f"{name}-parent",
        task_queue=PARENT_QUEUE,
    )
    return list(turns)
