"""`tempered eval` where one task's workflow fails: `asyncio.gather` raised at the first
`WorkflowFailureError` (a traceback) and left the other started tasks running in Temporal, with
nothing to end them. Now the others are cancelled there, and one line says which task failed
(exit 1). Real Temporal dev server, real SeaweedFS and sandbox; the model is scripted: its first
generate fails for good, every other one waits until it is cancelled."""

from __future__ import annotations

import asyncio

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError

from contracts.names import Activity
from contracts.rollout import GenerateRequest, GenerateResponse
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.workers.cli.eval_setup import RUN, Capture, recorded_run, workers, wrong
from tests.workers.cli.eval_setup import settings as settings  # a fixture
from tests.workflows.harness import ScriptedModel, connect, running_workers
from workers.cli import run


class FailsFirst(ScriptedModel):
    """The first generate fails (not retryable); the others hang until cancelled."""

    failed: str | None = None

    @activity.defn(name=Activity.GENERATE.value)
    async def generate(self, request: GenerateRequest) -> GenerateResponse:
        self.calls.append(request)
        if self.failed is None:
            self.failed = request.task_id
            raise ApplicationError("scripted: this task's model broke", non_retryable=True)
        await asyncio.Event().wait()  # until the worker stops: its workflow is cancelled first
        raise AssertionError("unreachable")


async def statuses(client: Client, calls: list[GenerateRequest]) -> set[WorkflowExecutionStatus]:
    """The statuses of the tasks' workflows the model was asked by (id: `<eval run>-<task>`)."""
    found = set()
    for call in calls:
        described = await client.get_workflow_handle(f"{call.run_id}-{call.task_id}").describe()
        assert described.status is not None
        found.add(described.status)
    return found


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_failed_task_cancels_the_others_and_says_which(
    settings: Settings, store: ObjectStore, capsys: Capture
) -> None:
    recorded_run(store)  # four held-out starter tasks
    model = FailsFirst(store, wrong)
    client = await connect(settings.temporal.address, settings.temporal.namespace)
    async with running_workers(client, workers(settings, store, model)):
        argv = ["eval", "--run", RUN, "--policy", "0", "--wait-for-workers"]
        code = await asyncio.to_thread(run, argv, settings)
        err = " ".join(capsys.readouterr().err.split())
        assert len(model.calls) == 4, model.calls  # every task started: three wait
        for _ in range(50):  # a cancel is a request: the workflows end at their next task
            found = await statuses(client, model.calls)
            if WorkflowExecutionStatus.RUNNING not in found:
                break
            await asyncio.sleep(0.2)
        assert found == {WorkflowExecutionStatus.FAILED, WorkflowExecutionStatus.CANCELED}, found
    assert code == 1, err
    assert f"task '{model.failed}' failed" in err, err
    assert (
        "the 3 other started task(s) were cancelled where still running" in err
        and "Traceback" not in err
    ), err
