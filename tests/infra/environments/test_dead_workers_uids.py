"""A dead worker's sweep kills what runs under its own workspace uids (`session_uid` of each of
its slots) and nothing under its neighbours' (the workers with the pids on either side)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from infra.environments import dead_workers
from infra.sandbox.workspace import SLOTS, session_uid

DEAD = 4321


def test_the_sweep_kills_the_dead_workers_slots_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    uids = {
        session_uid(0, DEAD): True,
        session_uid(SLOTS - 1, DEAD): True,
        session_uid(SLOTS - 1, DEAD - 1): False,
        session_uid(0, DEAD + 1): False,
    }
    processes = [
        SimpleNamespace(pid=pid, info={"uids": SimpleNamespace(real=uid)})
        for pid, uid in enumerate(uids, start=100)
    ]
    killed: list[int] = []
    monkeypatch.setattr(dead_workers.psutil, "process_iter", lambda attrs: iter(processes))
    monkeypatch.setattr(dead_workers.os, "kill", lambda pid, signal: killed.append(pid))
    assert dead_workers._kill_uids(DEAD) == 2
    assert killed == [p.pid for p, mine in zip(processes, uids.values(), strict=True) if mine]
