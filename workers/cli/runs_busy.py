"""Whether a workflow still works on a run's objects, which `tempered runs rm` and `runs prune`
delete: `workers/cli/runs.py` asks before either.

    running = asyncio.run(busy(settings, ["exp1", "exp1-eval-v3"]))
    # ["exp1-eval-v3 (its task: workflow exp1-eval-v3-starter-add-6)"]

What works on run R's objects: its training run (`train-R`) and its learner (`train-R-learner`,
which outlives a terminated run), both asked by id; its task workflows (`R-task-<task>`, or
`R-<task>` where R is an evaluation's id, `contracts.names.eval_run_id`) and the workflows of an
evaluation of R (`R-eval-v<N>...`, which read its policy versions), found by a visibility query
for running workflows whose id begins with `R-`. A workflow of another run whose id begins
alike (`R-eval-v3--starter-<tag>`'s, asked about `R-eval-v3`) is told apart by its TemperedRunId
search attribute; `tempered eval` starts its tasks without one (the workflow sets it on its
first task), and such a task counts as R's where R is an evaluation's id. Not asked: what
will start later (only a running training run or evaluation starts more).

What reads a run's policy versions from outside it: a live reader's marker
(`infra.retention.reading`), which `tempered eval --run R --policy N` writes before its first
task's workflow exists (`live_readers`, read from the store: `runs rm` refuses such a run;
`runs prune` keeps the version it names). Live by `infra.retention`'s rule: not ended, and
`until` still ahead.

    readers = live_readers(store, "exp1")
    # ["reader exp1-eval-v3--starter-x reads v3 until 2025-06-01T12:30:00Z (runs/exp1/...json)"]
"""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from contracts.names import (
    SearchAttr,
    evaluates,
    is_evaluation,
    learner_workflow_id,
    run_workflow_id,
)
from infra import keys
from infra.retention import reader_markers
from infra.settings import Settings
from infra.storage import ObjectStore
from workers.runtime import connect
from workflows.search import KEYS


async def busy(settings: Settings, runs: list[str]) -> list[str]:
    """The runs of `runs` that a workflow still works on, each as `runs rm` names it:
    `exp1 (its learner: workflow train-exp1-learner)`."""
    client = await connect(settings)
    found = []
    for run in runs:
        if why := await working_on(client, run):
            found.append(f"{run} ({why})")
    return found


async def working_on(client: Client, run: str) -> str | None:
    """What runs on `run`'s objects (the first found), or None."""
    training = run_workflow_id(run)
    for what, workflow_id in (
        ("its training run", training),
        ("its learner", learner_workflow_id(training)),
    ):
        if await _running(client, workflow_id):  # by id: visibility may lag a start
            return f"{what}: workflow {workflow_id}"
    query = f'WorkflowId STARTS_WITH "{run}-" AND ExecutionStatus = "Running"'
    async for execution in client.list_workflows(query):
        if evaluates(execution.id, run):
            return f"an evaluation of it: workflow {execution.id}"
        owner = execution.typed_search_attributes.get(KEYS[SearchAttr.RUN_ID])
        if owner == run or (owner is None and is_evaluation(run)):
            return f"its task: workflow {execution.id}"
    return None


async def _running(client: Client, workflow_id: str) -> bool:
    try:
        description = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status is RPCStatusCode.NOT_FOUND:
            return False
        raise
    return description.status is WorkflowExecutionStatus.RUNNING


def live_readers(store: ObjectStore, run: str) -> list[str]:
    """Each live reader marker of `run`'s policy versions (`infra.retention.reader_markers`),
    as `runs rm` names it."""
    live, _ = reader_markers(store, run)
    return [
        f"reader {key.removeprefix(keys.policy_readers_prefix(run)).removesuffix('.json')} reads "
        f"v{marker.version} until "
        f"{datetime.fromtimestamp(marker.until, UTC).strftime('%Y-%m-%dT%H:%M:%SZ')} ({key})"
        for key, marker in live.items()
    ]
