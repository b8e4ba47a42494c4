"""`tempered train` refuses, before the run starts, what the run could only fail on later: a
run id that is taken (stored, removed by `tempered runs rm`, or running) and a home that is no
writable directory. Real SeaweedFS and Temporal dev server; the stack itself is not started."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from temporalio.client import Client

from contracts.names import Queue
from infra import keys
from infra import stack as infra_stack
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.fixtures.cli_settings import cli_settings, dev_temporal, nowhere, nowhere_endpoint
from tests.fixtures.temporal import TemporalServer
from workers.cli import run
from workers.cli import train as train_cli
from workers.training import workflow_id

Capture = pytest.CaptureFixture[str]
TAKEN = "choose another --run-id"


@pytest.fixture
def settings(store: ObjectStore, tmp_path: Path) -> Settings:
    """The test's bucket; a Temporal nothing listens at (no run can start by mistake)."""
    return cli_settings(tmp_path / "home", store, temporal=nowhere())


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The stack counts as up (the test's S3 is external to it), with no run running
    (`test_train_running.py` asks a real Temporal); starting workers or a run is recorded, and
    fails the test where it must not happen."""
    started: list[str] = []
    monkeypatch.setattr(train_cli.stack, "up", lambda settings, say=None: [])
    monkeypatch.setattr(train_cli, "check_none_running", lambda settings: None)
    monkeypatch.setattr(train_cli, "ensure_workers", lambda settings: started.append("workers"))
    return started


def test_a_stored_or_removed_run_id_is_refused_before_workers_start(
    store: ObjectStore, settings: Settings, nothing_starts: list[str], capsys: Capture
) -> None:
    """`--run-id exp1` again (same preset, so prepare_run's create-only write of run.json
    passed) ran into the old run's trajectories and acks; a removed id failed in prepare_run,
    after the stack, five workers and the workflow had started."""
    store.put_json(keys.run_record_key("exp1"), {"run_id": "exp1"})
    store.put_json(keys.removed_run_key("gone"), {"run_id": "gone"})
    for run_id, why in (("exp1", f"s3://{store.bucket}/runs/exp1/"), ("gone", "runs rm")):
        assert run(["train", "--preset", "tiny", "--run-id", run_id], settings) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"tempered train: run id {run_id!r} is taken (") and TAKEN in err
        assert why in err and len(err.splitlines()) == 1
        assert nothing_starts == []  # refused before the workers (and the run) start


def test_the_dry_run_checks_the_run_id_when_s3_answers(
    store: ObjectStore, settings: Settings, capsys: Capture
) -> None:
    store.put_json(keys.run_record_key("exp1"), {"run_id": "exp1"})
    store.put_json(keys.removed_run_key("gone"), {"run_id": "gone"})
    for run_id in ("exp1", "gone"):
        assert run(["train", "--preset", "tiny", "--run-id", run_id, "--dry-run"], settings) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and TAKEN in captured.err
    assert run(["train", "--preset", "tiny", "--run-id", "new", "--dry-run"], settings) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["input"]["run_id"] == "new" and captured.err == ""
    endpoint = nowhere_endpoint()
    down = settings.model_copy(update={"s3": settings.s3.model_copy(update={"endpoint": endpoint})})
    assert run(["train", "--preset", "tiny", "--run-id", "exp1", "--dry-run"], down) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["input"]["run_id"] == "exp1"
    assert captured.err == (
        f"tempered train: run id 'exp1' not checked (cannot reach S3 at {endpoint}: connection "
        "refused); a run checks it once the stack is up\n"
    )
    assert not settings.home.exists()


def test_a_run_id_that_runs_points_at_attach(
    store: ObjectStore,
    settings: Settings,
    temporal_server: TemporalServer,
    namespace: str,
    nothing_starts: list[str],
    capsys: Capture,
) -> None:
    """A rerun of `train --run-id R` after the command died, while R runs (before its first
    activity stored anything): Temporal's "Workflow execution already started", exit 1."""
    settings = settings.model_copy(update={"temporal": dev_temporal(temporal_server, namespace)})

    async def start() -> None:  # no worker polls: it stays running
        client = await Client.connect(temporal_server.address, namespace=namespace)
        await client.start_workflow(
            "TrainingRunWorkflow", id=workflow_id("busy"), task_queue=Queue.AGENT_TASKS.value
        )

    asyncio.run(start())
    assert run(["train", "--preset", "tiny", "--run-id", "busy", "--no-workers"], settings) == 2
    err = capsys.readouterr().err
    assert err.startswith("tempered train: run id 'busy' is taken (it is running:") and TAKEN in err
    assert "tempered train --attach busy" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("where", ["file", "under a file", "read-only"])
def test_a_home_that_is_no_writable_directory_is_refused(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    """TEMPERED_HOME at a file passed `--dry-run`; a run failed with "[Errno 20] Not a
    directory: '.../run/temporal.pid'", naming neither home nor the setting."""
    (tmp_path / "afile").write_text("x")
    home = {"file": "afile", "under a file": "afile/home", "read-only": "ro/home"}[where]
    if where == "read-only":  # as a read-only mount answers; root may write past chmod
        (tmp_path / "ro").mkdir()
        real_access = os.access
        fake = lambda path, mode: Path(path) != tmp_path / "ro" and real_access(path, mode)  # noqa: E731
        monkeypatch.setattr(os, "access", fake)
    settings = Settings(home=tmp_path / home)
    problem = (
        f"home {tmp_path / home} (TEMPERED_HOME or the `home` setting) is not a writable directory"
    )
    assert run(["train", "--preset", "tiny", "--dry-run"], settings) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"tempered train: {problem}")
    assert len(captured.err.splitlines()) == 1
    with pytest.raises(ValueError, match="is not a writable directory"):
        infra_stack.up(settings)  # `tempered up`, `train --attach`
    assert not (tmp_path / "ro" / "home").exists()


def test_a_store_this_machine_cannot_reach_leaves_the_run_id_to_the_workers(
    settings: Settings, nothing_starts: list[str], monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    """With `--no-workers` the workers' S3 may be theirs alone (an in-cluster address): the
    check of the id stopped the run with exit 1 before it started. It says the id was not
    checked here and goes on (a running id is refused at the start, a removed one by
    prepare_run)."""
    endpoint = nowhere_endpoint()
    s3 = settings.s3.model_copy(update={"endpoint": endpoint, "max_attempts": 1})
    elsewhere = settings.model_copy(update={"s3": s3})
    reached: list[str] = []

    async def train(settings: Settings, run_input: object) -> None:
        reached.append("run")
        raise SystemExit(0)

    monkeypatch.setattr(train_cli, "_train", train)
    with pytest.raises(SystemExit):
        run(["train", "--preset", "tiny", "--run-id", "fresh1", "--no-workers"], elsewhere)
    err = capsys.readouterr().err
    assert err.startswith("tempered train: run id 'fresh1' not checked here (") and reached


def test_a_store_the_local_workers_share_must_answer_the_check(
    settings: Settings, nothing_starts: list[str], capsys: Capture
) -> None:
    """With workers here their store is this one: an S3 error in the check is not waved
    through (a reused id would meet the old run's trajectories); nothing starts."""
    endpoint = nowhere_endpoint()
    s3 = settings.s3.model_copy(update={"endpoint": endpoint, "max_attempts": 1})
    unreachable = settings.model_copy(update={"s3": s3})
    assert run(["train", "--preset", "tiny", "--run-id", "fresh2"], unreachable) != 0
    assert "not checked here" not in capsys.readouterr().err and nothing_starts == []
