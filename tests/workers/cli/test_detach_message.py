"""What Ctrl-C in `tempered train` says of where its run goes on: "in the background workers"
only where this home's background workers live; after `--no-workers` (none started, none seen)
it said the same, though the run then waits for a worker. At the function level (`_follow`, its
follower cancelled as Ctrl-C's `asyncio.run` cancels it; a real Ctrl-C needs a terminal): the
background workers are pidfiles under the test's home naming live processes (this one)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any, NoReturn

import pytest

from contracts.names import Queue
from contracts.run import TrainingRunInput
from infra.processes import start_ticks
from infra.settings import Settings
from workers.background import worker_service
from workers.cli import train as train_cli


def detach(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """`_follow` cancelled as Ctrl-C cancels it (what it prints goes to stderr)."""

    async def cancelled(*args: Any) -> NoReturn:
        raise asyncio.CancelledError

    monkeypatch.setattr(train_cli, "follow", cancelled)

    async def follow_it() -> None:
        run_input = TrainingRunInput(run_id="r1")
        await train_cli._follow(None, None, run_input, settings, 0.0)  # type: ignore[arg-type]

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(follow_it())


@pytest.mark.parametrize("live", [list(Queue), [], [Queue.AGENT_TASKS]], ids=["all", "none", "one"])
def test_ctrl_c_says_where_the_run_goes_on_from_the_workers_that_live(
    live: list[Queue],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = Settings(home=tmp_path / "home")
    for queue in live:  # a live background worker of this home: its pidfile names a live process
        pidfile = worker_service(settings, queue).pidfile
        pidfile.parent.mkdir(parents=True, exist_ok=True)
        pidfile.write_text(json.dumps({"pid": os.getpid(), "ticks": start_ticks(os.getpid())}))
    detach(settings, monkeypatch)
    err = " ".join(capsys.readouterr().err.split())
    assert "follow it again: tempered train --attach r1" in err, err
    if len(live) == len(Queue):
        assert "detached; run r1 goes on in the background workers." in err, err
        return
    assert "in the background workers" not in err, err
    assert "goes on where workers poll its queues, and waits while none does" in err, err
    missing = ", ".join(queue.value for queue in Queue if queue not in live)
    assert f"of this home serves {missing} (" in err and "tempered worker all" in err, err
    if not live:
        assert "no background worker of this home serves" in err, err
