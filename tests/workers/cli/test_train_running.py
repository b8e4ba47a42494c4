"""`tempered train` while a training run runs: Ctrl-C only detaches a `train`, so rerunning
`make train` after it started a second run beside the first, saying nothing. A new run is now
refused while one runs, naming it and how to follow it, unless `--alongside` asks for both
(real Temporal dev server, the session's; a run no worker polls stays running)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from temporalio.service import RPCError, RPCStatusCode

from contracts.run import TrainingRunInput
from infra.settings import Settings, TemporalSettings
from tests.fixtures.temporal import TemporalServer
from workers.cli import run, train_running
from workers.cli import train as train_cli
from workers.cli.train_running import RunsRunning
from workers.runtime import connect
from workers.training import start_run


@pytest.fixture
def settings(temporal_server: TemporalServer, namespace: str, tmp_path: Path) -> Settings:
    return Settings(
        home=tmp_path / "home",
        temporal=TemporalSettings(address=temporal_server.address, namespace=namespace),
    )


async def running(settings: Settings, *runs: str) -> None:
    """Start `runs` (no worker polls: they stay running) and wait until visibility lists them."""
    client = await connect(settings)
    for run_id in runs:
        await start_run(client, TrainingRunInput(run_id=run_id))
    deadline = time.monotonic() + 10
    while len([w async for w in client.list_workflows('ExecutionStatus = "Running"')]) < len(runs):
        assert time.monotonic() < deadline, "the runs never showed as running"
        await asyncio.sleep(0.1)


def test_a_new_run_beside_a_running_one_is_refused_unless_alongside(
    settings: Settings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    done: list[str] = []

    async def train(_settings: Settings, run_input: TrainingRunInput) -> tuple[object, float]:
        done.append(f"start {run_input.run_id}")
        raise train_cli.LostTemporal  # started, then detached: no run to follow here

    monkeypatch.setattr(
        train_cli.stack, "up", lambda _settings, say=None: []
    )  # Temporal is the test's
    monkeypatch.setattr(train_cli, "check_run_id", lambda _store, _run: None)  # no S3 here
    monkeypatch.setattr(train_cli, "ensure_workers", lambda _s: done.append("workers") or [])
    monkeypatch.setattr(train_cli, "_train", train)
    assert run(["train", "--preset", "tiny", "--run-id", "alone"], settings) == train_cli.LOST
    assert done == ["workers", "start alone"]  # nothing ran: it started
    done.clear()
    asyncio.run(running(settings, "first", "second"))

    assert run(["train", "--preset", "tiny", "--run-id", "third"], settings) == 2
    captured = capsys.readouterr()
    assert done == [], "workers or a run started beside the running ones"
    assert captured.err == (
        "tempered train: 2 training runs run: first, second (an interrupted `tempered train` "
        "detaches, and its run goes on): follow one with `tempered train --attach first` or "
        "`tempered train --attach second`, stop one with `tempered stop RUN`, or start this run "
        "beside them with `tempered train --alongside`\n"
    )
    assert str(RunsRunning(["first"])).startswith(
        "training run first runs (an interrupted `tempered train` detaches, and its run goes "
        "on): follow it with `tempered train --attach first`, stop it with `tempered stop first`"
    )

    argv = ["train", "--preset", "tiny", "--run-id", "third", "--alongside"]
    assert run(argv, settings) == train_cli.LOST
    assert done == ["workers", "start third"]
    assert run(["train", "--attach", "first", "--alongside"], settings) == 2
    assert "--attach takes no run options (got --alongside)" in capsys.readouterr().err


def test_a_temporal_that_will_not_list_runs_checks_nothing_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A key that may start workflows but not list them: the check said "cannot reach
    Temporal" and no run started, where one started before the check existed."""

    async def answers(*args: object, **kwargs: object) -> None:
        return None

    async def will_not_list(client: object) -> list[str]:
        raise RPCError("Request unauthorized.", RPCStatusCode.PERMISSION_DENIED, b"")

    monkeypatch.setattr(train_running, "connect", answers)
    monkeypatch.setattr(train_running, "running_run_ids", will_not_list)
    train_running.check_none_running(Settings())
    said = capsys.readouterr().err
    assert "not checked" in said and "Request unauthorized." in said and "--alongside" in said
