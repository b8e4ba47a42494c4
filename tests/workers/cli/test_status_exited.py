"""`tempered status` showed an exited worker's last rates as if it still ran.

A worker that exited but was not reaped yet (a zombie: `kill -0` still answers) read as alive,
and a worker that stopped exporting (stopped, hung) kept its last rates for ever. Real worker
processes write real telemetry files through `infra.telemetry` (the sandbox and inference
instruments their activities record to); the reader is the one `tempered status` uses.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import infra.telemetry_figures as figures_module
from infra.telemetry_figures import WorkerFigures, read_live_figures
from workers.cli.status import StatusReport, worker_rows

WORKER = """
import sys, time
from pathlib import Path
from infra import telemetry as tm
from infra.settings import Settings
telemetry = tm.setup_telemetry(Settings(home=Path(sys.argv[1])), "sandbox", export_interval_s=0.2)
for _ in range(6):
    tm.record_sandbox_run("bwrap", "ok", 0.01)
    tm.record_inference_row(50, 0.1)
    time.sleep(0.15)
telemetry.flush()
print("written", flush=True)
if sys.argv[2] == "exit":
    telemetry.shutdown()
    sys.exit(0)
while True:
    tm.record_sandbox_run("bwrap", "ok", 0.01)
    time.sleep(0.05)
"""


def start_worker(home: Path, mode: str) -> subprocess.Popen[str]:
    """A worker process that has written its telemetry; killed if it says anything else."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(home), mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    if first != "written":
        proc.kill()
        proc.wait()
        pytest.fail(f"worker said {first!r}, not 'written'")
    return proc


def only_worker(home: Path) -> WorkerFigures:
    found = read_live_figures(home / "telemetry")
    assert len(found) == 1, found
    return next(iter(found.values()))


def no_rates(worker: WorkerFigures) -> None:
    assert worker.sandbox_runs_per_s is None and worker.tokens_per_s is None
    assert worker.cpu_percent is None
    assert all(q.per_s is None for q in worker.queues.values())
    assert worker.sandbox_runs.get("ok", 0) >= 6  # the counts stay


def status_row_state(home: Path, pid: int, worker: WorkerFigures) -> str:
    """The state `tempered status` shows in the worker's row (its one row)."""
    report = StatusReport(
        home=str(home), services={}, temporal="-", workers={f"sandbox-{pid}": worker}
    )
    states = [row.state for row in worker_rows(report) if row.pid == pid]
    assert len(states) == 1, states
    return states[0]


@pytest.mark.timeout(60)
def test_an_exited_unreaped_worker_is_not_alive_and_shows_no_rates(tmp_path: Path) -> None:
    proc = start_worker(tmp_path, "exit")
    try:
        deadline = time.monotonic() + 20
        while psutil.Process(proc.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, "the worker never exited"
            time.sleep(0.05)
        assert psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE
        worker = only_worker(tmp_path)
        assert worker.pid == proc.pid
        assert not worker.alive and not worker.live
        no_rates(worker)
        assert status_row_state(tmp_path, proc.pid, worker) == "exited"
    finally:
        proc.wait(timeout=10)


@pytest.mark.timeout(60)
def test_a_worker_that_stopped_exporting_is_stale_and_shows_no_rates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(figures_module, "STALE_S", 1.0)  # the floor; its own interval is 0.2 s
    proc = start_worker(tmp_path, "run")
    try:
        running = only_worker(tmp_path)
        assert running.alive and running.live and not running.stale
        assert running.sandbox_runs_per_s is not None
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(2.5)
        worker = only_worker(tmp_path)
        assert worker.alive and worker.stale and not worker.live
        assert worker.stale_after_s is not None and worker.stale_after_s >= 1.0
        no_rates(worker)
        assert status_row_state(tmp_path, proc.pid, worker) == "stale"
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
        proc.wait(timeout=10)
