"""`tempered status`: readable at 80 columns, `--json` with the raw figures, runs found through
Temporal visibility and read through the typed `progress` query (real dev server, real worker)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import time
from pathlib import Path

import pytest
from rich.console import Console
from temporalio.worker import Worker

from contracts.evaluation import EvalResult
from contracts.learner import LearnerProgress
from contracts.names import Queue
from contracts.run import RunProgress, TrainingRunInput
from infra import telemetry as tm
from infra.settings import Settings, TemporalSettings
from infra.telemetry_figures import QueueFigures, WorkerFigures
from tests.fixtures.cli_settings import cli_settings, dev_temporal
from tests.fixtures.temporal import TemporalServer
from workers.backlog import QueueBacklog
from workers.cli import run
from workers.cli.status import StatusReport, render
from workers.runtime import BUILDERS, connect
from workers.training import RunningRun, start_run

NOW = 1_800_000_000.0
ERROR = (
    "execute: ApplicationError: SandboxInfra: bwrap: setting up uid map: Permission denied "
    "(is unprivileged user namespace creation disabled on this host?)"
)


def busy_cluster() -> StatusReport:
    """Every kind of row: a process serving all queues, an exited one, a starting background
    worker, a run with progress, a run that does not answer, a long run id."""
    everything = "+".join(q.value for q in Queue)
    return StatusReport(
        home="/var/lib/tempered/a/rather/long/state/directory/for/an/operator/to/read",
        temporal="127.0.0.1:7233",
        services={
            "temporal": "running (pid 41234) at 127.0.0.1:7233, UI http://127.0.0.1:8233",
            "s3": "running (pid 41240) at http://127.0.0.1:8333",
        },
        background_workers={"learner": 51234},
        backlogs=[
            QueueBacklog(
                queue=q.value,
                kind="workflow" if q is Queue.AGENT_TASKS else "activity",
                backlog=1234 if q is Queue.INFERENCE else 0,
                oldest_s=95.0 if q is Queue.INFERENCE else 0.0,
                added_per_s=40.5,
                dispatched_per_s=12.25,
                pollers=3,
            )
            for q in Queue
        ],
        workers={
            f"{everything}-41300": WorkerFigures(
                service=everything,
                pid=41300,
                alive=True,
                age_s=1.0,
                queues={
                    "inference": QueueFigures(in_flight=16, succeeded=12000, per_s=12.5),
                    "sandbox": QueueFigures(
                        in_flight=128,
                        succeeded=99871,
                        failed=1234,
                        per_s=345.25,
                        last_error_at=NOW - 180,
                        last_error=ERROR,
                    ),
                },
            ),
            "sandbox-41100": WorkerFigures(service="sandbox", pid=41100, alive=False, age_s=600),
        },
        runs=[
            RunningRun(
                run_id="run-20250101-120000",
                workflow_id="train-run-20250101-120000",
                progress=RunProgress(
                    tasks_started=4096,
                    tasks_done=4000,
                    in_flight=96,
                    learner=[
                        LearnerProgress(
                            step=1234,
                            policy_version=1234,
                            trained_groups=8,
                            reward_mean=0.35,
                            staleness=2,
                        )
                    ],
                    evals=[
                        EvalResult(policy_version=0, pass_at_1=0.1, tasks=40),
                        EvalResult(policy_version=1200, pass_at_1=0.42, tasks=40),
                    ],
                ),
            ),
            RunningRun(run_id="stuck", workflow_id="train-stuck", progress=None),
        ],
    )


def test_status_at_80_columns_shows_every_cell_whole() -> None:
    console = Console(width=80, record=True, color_system=None, file=io.StringIO())
    render(busy_cluster(), console, now=NOW)
    text = console.export_text()
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in text and "..." not in text
    for header in (
        "queue",
        "pid",
        "alive",
        "in flight",
        "done/s",
        "failed",
        "cancelled",
        "last error",
        "step",
        "tasks",
        "reward",
        "held-out",
        "stale",
        "waiting",
        "oldest",
        "taken/s",
    ):
        assert header in text, header

    def row(*cells: str) -> str:
        """The one line holding all of `cells`, whole."""
        (found,) = [line for line in lines if all(f" {cell} " in f" {line} " for cell in cells)]
        return found

    row("inference", "41300", "up", "16", "12.5", "0", "-")
    row("sandbox", "41300", "up", "128", "345", "1234", "3m ago")
    row("sandbox", "41100", "exited", "-")
    row("learner", "41300", "up", "0", "-")
    row("learner", "51234", "starting")
    row("agent-tasks", "41300", "up", "-")
    row("run-20250101-120000", "1234", "4000/4096", "96", "+0.350", "0.42 (v1200)", "2")
    row("stuck", "?")
    row("inference", "1234", "95s", "40.5", "12.2", "3")  # the task queues table
    row("sandbox", "0", "-", "40.5", "12.2", "3")
    assert "stuck: no answer to the progress query" in text
    assert ERROR in " ".join(text.split())  # the last error in full, wrapped at spaces


def test_status_json_has_the_raw_figures_and_a_queue_nobody_serves_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Also where Temporal cannot be reached: the figures there are, and exit 1 (it was 0, so a
    script's `tempered status && …` took an unreachable Temporal for a healthy one)."""
    report = busy_cluster()
    console = Console(width=80, record=True, color_system=None, file=io.StringIO())
    render(report.model_copy(update={"workers": {}, "background_workers": {}}), console, now=NOW)
    none_rows = [line.split() for line in console.export_text().splitlines() if " none " in line]
    assert [cells[0] for cells in none_rows] == [q.value for q in Queue]

    settings = Settings(
        home=tmp_path,
        temporal=TemporalSettings(address="127.0.0.1:1"),  # nothing listens
    )
    telemetry = tm.setup_telemetry(settings, "sandbox", export_interval_s=60)
    try:
        tm.record_sandbox_run("local", "passed", 0.25)
        telemetry.flush()
    finally:
        telemetry.shutdown()
    assert run(["status", "--json"], settings) == 1  # it says so, and so does its exit status
    raw = json.loads(capsys.readouterr().out)
    worker = raw["workers"][f"sandbox-{os.getpid()}"]
    assert worker["alive"] is True and worker["sandbox_runs"] == {"passed": 1}
    assert raw["services"] == {"temporal": "stopped", "s3": "stopped", "codec": "stopped"}
    assert (
        raw["runs"] is None
        and raw["backlogs"] is None
        and raw["temporal"] == "127.0.0.1:1"
        and raw["temporal_error"]
    )
    assert run(["status"], settings) == 1
    assert "cannot reach Temporal at 127.0.0.1:1" in capsys.readouterr().out


@pytest.mark.asyncio
async def test_status_finds_running_training_runs_and_reads_their_progress(
    tmp_path: Path,
    temporal_server: TemporalServer,
    namespace: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = cli_settings(tmp_path, temporal=dev_temporal(temporal_server, namespace))
    client = await connect(settings)
    # only the workflows run: the run waits for its first activity (no rewards worker) and
    # answers its progress query meanwhile
    plan = BUILDERS[Queue.AGENT_TASKS](settings)
    async with Worker(client, task_queue=Queue.AGENT_TASKS.value, workflows=plan.workflows):
        handle = await start_run(client, TrainingRunInput(run_id="status-probe", steps=2))
        try:
            deadline = time.monotonic() + 30
            while True:
                code = await asyncio.to_thread(run, ["status", "--json"], settings)
                raw = json.loads(capsys.readouterr().out)
                assert code == (1 if raw["temporal_error"] else 0)  # a busy machine's timeout
                answered = raw["runs"] and raw["runs"][0]["progress"] is not None
                waiting = {b["queue"]: b["backlog"] for b in raw["backlogs"] or []}
                seen = waiting.get(Queue.REWARDS.value)  # the server's figures lag a little
                if (answered and seen) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.5)
            assert raw["temporal_error"] is None
            (found,) = raw["runs"]
            assert found["run_id"] == "status-probe"  # the TemperedRunId search attribute
            assert found["workflow_id"] == handle.id == "train-status-probe"
            assert RunProgress.model_validate(found["progress"]) == RunProgress()
            assert waiting[Queue.REWARDS.value] == 1  # load_tasks, and no rewards worker
            assert waiting[Queue.AGENT_TASKS.value] == 0  # the workflow worker keeps up
            assert await asyncio.to_thread(run, ["status"], settings) == 0
            assert any(
                line.split()[:2] == ["status-probe", "0"]
                for line in capsys.readouterr().out.splitlines()
            )
        finally:
            await handle.terminate("test over")
