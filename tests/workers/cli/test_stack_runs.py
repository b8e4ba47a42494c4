"""The stack and the runs on it: `tempered down` while a training run runs is refused unless
`--force` (its followers then lost Temporal), a `train` that loses Temporal while it follows a
run detaches (the run is durable) with its own exit status, and a namespace the server does not
have is reported as that, not as a Temporal that cannot be reached. A real Temporal dev server
(the session's); nothing of the stack is started."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from contracts.run import TrainingRunInput
from infra.processes import free_port
from infra.settings import Settings, TemporalSettings
from tests.fixtures.temporal import TemporalServer
from workers.cli import run
from workers.cli import stack as stack_cli
from workers.cli import train as train_cli
from workers.cli.errors import describe
from workers.runtime import connect
from workers.training import start_run

Capture = pytest.CaptureFixture[str]


@pytest.fixture
def settings(temporal_server: TemporalServer, namespace: str, tmp_path: Path) -> Settings:
    """The session's Temporal (not ours: `down` stops nothing of it) in the test's namespace."""
    return Settings(
        home=tmp_path / "home",
        temporal=TemporalSettings(address=temporal_server.address, namespace=namespace),
    )


@pytest.fixture
def stopped(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What `down` stopped, in order: the workers, then the stack (neither runs here)."""
    done: list[str] = []

    def stop_workers(settings: Settings) -> list[str]:
        done.append("workers")
        return []

    def down(settings: Settings) -> list[str]:
        done.append("stack")
        return []

    monkeypatch.setattr(stack_cli, "stop_workers", stop_workers)
    monkeypatch.setattr(stack_cli.stack, "down", down)
    return done


def test_down_refuses_while_a_run_runs_unless_forced(
    settings: Settings, stopped: list[str], capsys: Capture
) -> None:
    """`down` during a run said nothing; the `train` following it then failed after a minute of
    retries with "cannot reach Temporal", though the run was intact (`up`, and `status` listed
    it)."""
    asyncio.run(start_busy_run(settings))
    assert run(["down"], settings) == 2
    captured = capsys.readouterr()
    assert stopped == [] and captured.out == ""
    assert captured.err.startswith("tempered down: 1 training run still runs: busy")
    assert (
        "tempered train --attach busy" in captured.err and "tempered down --force" in captured.err
    )
    assert run(["down", "--force"], settings) == 0
    assert stopped == ["workers", "stack"]
    assert "tempered train --attach busy" in capsys.readouterr().err  # said, not asked


def test_down_asks_its_own_temporal_however_late_it_answers(
    settings: Settings, stopped: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 1 s gRPC probe (`GRPC_PROBE_S`) is for a stranger on Temporal's port: asked of the
    stack's own Temporal, a late answer (a loaded host) read as no run running, and `down`
    stopped the stack under one."""
    asyncio.run(start_busy_run(settings))
    monkeypatch.setattr(stack_cli, "_speaks_grpc", lambda *_: False)  # it answers late
    monkeypatch.setattr(stack_cli.stack, "temporal_service", lambda _: _Ours())
    assert run(["down"], settings) == 2 and stopped == []


class _Ours:
    """The stack's Temporal service, as its pidfile names a live process of ours."""

    def pid(self) -> int:
        return 1


async def start_busy_run(settings: Settings) -> None:
    """A training run that stays running (no worker polls), once visibility lists it."""
    client = await connect(settings)
    await start_run(client, TrainingRunInput(run_id="busy"))
    deadline = time.monotonic() + 10
    while not [w async for w in client.list_workflows('ExecutionStatus = "Running"')]:
        assert time.monotonic() < deadline, "the run never showed as running"  # visibility
        await asyncio.sleep(0.1)


def test_down_with_no_run_running_or_no_temporal_to_ask_stops_at_once(
    settings: Settings, stopped: list[str], tmp_path: Path, capsys: Capture
) -> None:
    assert run(["down"], settings) == 0 and stopped == ["workers", "stack"]
    assert capsys.readouterr().err == ""
    nobody = TemporalSettings(address=f"127.0.0.1:{free_port()}")  # nothing listens there
    assert run(["down"], Settings(home=tmp_path / "other", temporal=nobody)) == 0
    assert stopped == ["workers", "stack"] * 2


class _Handle:
    id = "train-r"


@pytest.mark.parametrize("attach", [False, True])
@pytest.mark.parametrize(
    ("status", "why"),
    [(RPCStatusCode.UNAVAILABLE, "tcp connect error"), (RPCStatusCode.UNKNOWN, "transport error")],
)
def test_a_train_that_loses_temporal_detaches_with_its_own_status(
    attach: bool,
    status: RPCStatusCode,
    why: str,
    tmp_path: Path,
    capsys: Capture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It printed "cannot reach Temporal (tcp connect error); is the stack up?" and exited 1,
    which `train` defines as "the run failed"; a long poll cut by `down --force` reads
    "transport error" (UNKNOWN), which did so still: lost too, when nothing answers."""

    async def lost(*args: Any) -> None:
        raise RPCError(why, status, b"")

    async def fake_connect(settings: Settings, runtime: object) -> object:
        return object()

    async def fake_start(client: object, run_input: TrainingRunInput) -> _Handle:
        return _Handle()

    class Found:
        handle, run_input, closed = _Handle(), TrainingRunInput(run_id="r"), None
        started = datetime.now(UTC)

    async def fake_attach(client: object, run_id: str) -> Found:
        return Found()

    monkeypatch.setattr(train_cli, "_bring_up", lambda *args, **kwargs: None)
    monkeypatch.setattr(train_cli, "connect", fake_connect)
    monkeypatch.setattr(train_cli, "start_run", fake_start)
    monkeypatch.setattr(train_cli, "attach", fake_attach)
    monkeypatch.setattr(train_cli, "follow", lost)
    gone = TemporalSettings(address=f"127.0.0.1:{free_port()}")  # nothing answers there
    settings = Settings(home=tmp_path / "home", temporal=gone)
    argv = ["train", "--attach", "r"] if attach else ["train", "--preset", "tiny", "--run-id", "r"]
    assert run(argv, settings) == train_cli.LOST
    err = capsys.readouterr().err
    assert f"lost Temporal at {settings.temporal.address} ({why})" in err
    assert "tempered train --attach r" in err and "cannot reach" not in err
    assert f"{train_cli.LOST} lost Temporal" in (train_cli.__doc__ or "")  # documented


def test_a_namespace_the_server_lacks_is_named_as_such(temporal_server: TemporalServer) -> None:
    """`train` with TEMPERED_TEMPORAL__NAMESPACE=other printed "cannot reach Temporal (Namespace
    other is not found.); is the stack up? run `tempered up`", and `up` said it ran."""

    async def start() -> RPCError:
        lacking = TemporalSettings(address=temporal_server.address, namespace="no-such-ns")
        client = await connect(Settings(temporal=lacking))
        with pytest.raises(RPCError) as refused:
            await start_run(client, TrainingRunInput(run_id="r"))
        return refused.value

    err = asyncio.run(start())
    assert err.status is RPCStatusCode.NOT_FOUND
    text = describe(err)
    assert "cannot reach" not in text and "is the stack up" not in text
    assert text.startswith("Temporal has no namespace (Namespace no-such-ns is not found.)")
    assert "TEMPERED_TEMPORAL__NAMESPACE" in text
    missing = RPCError("workflow not found for ID: train-x", RPCStatusCode.NOT_FOUND, b"")
    assert describe(missing) == "Temporal answered: not found (workflow not found for ID: train-x)"
