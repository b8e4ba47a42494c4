"""`tempered train --attach RUN` on a run that ended while no command followed it (real Temporal
dev server; a stand-in TrainingRunWorkflow that ends as its run id says): it exited 2 "is not
running (completed)", and the run's report was never written. Now a completed run's report is
written from its workflow's result, with the run's own wall time (close minus start); a failed
run exits 1 with its error, a terminated or cancelled one says so; no worker starts for any."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from contracts.names import Queue, Workflow
from contracts.run import TrainingRunInput, TrainingRunResult
from infra.settings import Settings, TemporalSettings
from tests.fixtures.temporal import TemporalServer
from workers.cli import run
from workers.runtime import connect
from workers.training import start_run

Capture = pytest.CaptureFixture[str]


@workflow.defn(name=Workflow.TRAINING_RUN.value)
class EndsAsNamed:
    """`done` completes, `broken` fails, any other run waits until it is ended from outside."""

    @workflow.run
    async def run(self, run_input: TrainingRunInput) -> TrainingRunResult:
        if run_input.run_id == "broken":
            raise ApplicationError("suite 'x' has no training tasks", non_retryable=True)
        if run_input.run_id != "done":
            await workflow.wait_condition(lambda: False)
        await workflow.sleep(1)  # a wall time to report
        return TrainingRunResult(
            run_id=run_input.run_id, steps=3, tasks_started=6, tasks_done=6, history=[], evals=[]
        )


@pytest.fixture
def settings(temporal_server: TemporalServer, namespace: str, tmp_path: Path) -> Settings:
    return Settings(
        home=tmp_path,
        temporal=TemporalSettings(address=temporal_server.address, namespace=namespace),
    )


async def ended_runs(settings: Settings) -> tuple[float, float]:
    """Runs `done` (completed), `broken` (failed), `stuck` (terminated) and `halted`
    (cancelled), all closed once this returns; `done`'s wall time by its workflow."""
    client = await connect(settings)
    workflows = [EndsAsNamed]
    runner = UnsandboxedWorkflowRunner()
    queue = Queue.AGENT_TASKS.value
    async with Worker(client, task_queue=queue, workflows=workflows, workflow_runner=runner):
        handles = {
            run_id: await start_run(client, TrainingRunInput(run_id=run_id, steps=3))
            for run_id in ("done", "broken", "stuck", "halted")
        }
        await handles["done"].result()
        with pytest.raises(WorkflowFailureError):
            await handles["broken"].result()
        await handles["stuck"].terminate(reason="test over")
        await handles["halted"].cancel()
        with pytest.raises(WorkflowFailureError):
            await handles["halted"].result()
    done = await handles["done"].describe()
    assert done.close_time is not None
    return (done.close_time - done.start_time).total_seconds(), done.close_time.timestamp()


def test_attach_to_a_run_that_ended_writes_its_report_from_its_result(
    settings: Settings, capsys: Capture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.cli import train

    started: list[str] = []
    monkeypatch.setattr(train.stack, "up", lambda _settings, say=None: [])  # Temporal is the test's
    monkeypatch.setattr(train, "ensure_workers", lambda _settings: started.append("workers") or [])
    wall_s, closed = asyncio.run(ended_runs(settings))
    ends: list[float | None] = []
    write_report = train.write_report
    monkeypatch.setattr(train, "write_report", lambda *a: ends.append(a[-1]) or write_report(*a))

    assert run(["train", "--attach", "done"], settings) == 0
    out = capsys.readouterr().out
    assert "run done ended (completed) at " in out and "run done finished in" in out, out
    report = json.loads((settings.home / "reports" / "done" / "report.json").read_text())
    assert report["tasks_done"] == 6 and report["steps_taken"] == 3
    assert report["wall_time_s"] == pytest.approx(wall_s, abs=0.2) and wall_s >= 1
    assert (settings.home / "reports" / "done" / "reward_curve.png").exists()
    assert ends == [closed]  # its profile's window ends where the run did, not now

    for run_id, said in (
        ("broken", "failed: suite 'x' has no training tasks"),
        ("stuck", "was terminated (test over): no result, no report"),
        ("halted", "was cancelled: no result, no report"),
    ):
        assert run(["train", "--attach", run_id], settings) == 1, run_id
        err = capsys.readouterr().err
        assert err == f"tempered train: run {run_id} {said}\n"
        assert not (settings.home / "reports" / run_id).exists()
    assert started == [], "a worker started for a run that had ended"
