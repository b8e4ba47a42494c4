"""`tempered train --attach RUN` on a run pinned to a build no worker polls (real Temporal dev
server; a stand-in TrainingRunWorkflow that waits): it printed a line of zeros for ever. Now,
once the run has been silent for `stalled.SILENT_S`, it says the run is pinned to that build, the
current build, and the ways out; `tempered status --json` carries the same line under `silent`."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from temporalio import workflow
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.worker import UnsandboxedWorkflowRunner, Worker, WorkerDeploymentConfig

from contracts.names import Queue, Workflow
from contracts.run import TrainingRunInput, TrainingRunResult
from infra.settings import Settings, TemporalSettings
from tests.fixtures.temporal import TemporalServer
from workers import versioning
from workers.cli import run, stalled
from workers.runtime import connect
from workers.training import start_run

RUN = "pinned"


@workflow.defn(name=Workflow.TRAINING_RUN.value)
class Waits:
    """A run that waits until it is ended from outside."""

    @workflow.run
    async def run(self, run_input: TrainingRunInput) -> TrainingRunResult:
        await workflow.wait_condition(lambda: False)
        raise AssertionError("never")


@pytest.fixture
def settings(temporal_server: TemporalServer, namespace: str, tmp_path: Path) -> Settings:
    return Settings(
        home=tmp_path,
        temporal=TemporalSettings(address=temporal_server.address, namespace=namespace),
    )


def build(client_settings: Settings, build_id: str) -> WorkerDeploymentConfig:
    return WorkerDeploymentConfig(
        version=WorkerDeploymentVersion(client_settings.temporal.deployment, build_id),
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.PINNED,
    )


async def pinned_run(settings: Settings) -> None:
    """Run RUN started on build b1 (pinned there), then b1's worker gone and b2 made current."""
    client = await connect(settings)
    queue, runner = Queue.AGENT_TASKS.value, UnsandboxedWorkflowRunner()
    for build_id in ("b1", "b2"):
        config = build(settings, build_id)
        async with Worker(
            client,
            task_queue=queue,
            workflows=[Waits],
            workflow_runner=runner,
            deployment_config=config,
        ):
            await versioning.promote(client, config.version)
            if build_id == "b1":
                handle = await start_run(client, TrainingRunInput(run_id=RUN, steps=3))
                for _ in range(100):
                    info = (await handle.describe()).raw_description.workflow_execution_info
                    if info.versioning_info.deployment_version.build_id == "b1":
                        break
                    await asyncio.sleep(0.1)
                else:
                    raise AssertionError("the run never ran on b1")


def test_attach_to_a_run_pinned_to_a_build_no_worker_polls_says_so(
    settings: Settings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.cli import train

    monkeypatch.setattr(train.stack, "up", lambda _settings, say=None: [])  # Temporal is the test's
    monkeypatch.setattr(train, "ensure_workers", lambda _settings: [])
    monkeypatch.setattr(versioning, "LIVE_POLLER_S", 3.0)  # b1 polled seconds ago, not 70
    monkeypatch.setattr(stalled, "SILENT_S", 2.0)  # the follower says why after 2 s, not 15
    asyncio.run(pinned_run(settings))
    said = f"run {RUN} is pinned to build b1 of deployment tempered, which no worker polls"

    assert run(["status", "--json"], settings) == 0
    report = json.loads(capsys.readouterr().out)
    assert said in report["silent"][RUN] and "the current build is b2" in report["silent"][RUN]

    out = io.StringIO()
    codes: list[int] = []

    def attach() -> None:
        with redirect_stdout(out):
            codes.append(run(["train", "--attach", RUN], settings))

    began = time.monotonic()
    follower = threading.Thread(target=attach, daemon=True)
    follower.start()
    while said not in out.getvalue() and time.monotonic() - began < 40:
        time.sleep(0.5)
    waited = time.monotonic() - began
    asyncio.run(_terminate(settings))
    follower.join(30)
    text = out.getvalue()
    assert said in text, text
    assert waited < 35, waited
    assert "the current build is b2" in text and "TEMPERED_TEMPORAL__BUILD_ID=b1" in text
    assert "--versioning-override-behavior auto_upgrade" in text
    assert "temporal workflow terminate" in text
    assert text.count(said) == 1, text  # once per cause, not every poll
    assert codes == [1]  # terminated: no result


async def _terminate(settings: Settings) -> None:
    client = await connect(settings)
    from workers.training import workflow_id

    await client.get_workflow_handle(workflow_id(RUN)).terminate(reason="test over")
