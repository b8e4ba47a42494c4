"""Live figures across a worker's restart: each process start writes a file of its own (a
container restarted keeps its pid), and a counter that went back (a restarted process's file
read as one with the old) gives no rate, never a negative one."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import psutil

from infra import telemetry as tm
from infra.settings import Settings
from infra.telemetry_figures import worker_figures


def snapshot(ts: float, succeeded: int, tokens: int) -> dict[str, Any]:
    return {
        "kind": "metrics",
        "ts": ts,
        "points": [
            {
                "name": "tempered.activity.attempts",
                "attrs": {"queue": "inference", "outcome": "ok"},
                "type": "sum",
                "value": succeeded,
            },
            {"name": "tempered.inference.tokens", "attrs": {}, "type": "sum", "value": tokens},
        ],
    }


def test_a_counter_that_went_back_gives_no_rate() -> None:
    now = time.time()
    old = [snapshot(now - 40, 5000, 900000), snapshot(now - 30, 5100, 910000)]
    restarted = [*old, snapshot(now - 20, 5200, 920000), snapshot(now - 1, 3, 400)]
    worker = worker_figures("inference", 7, True, restarted)
    assert worker is not None
    assert worker.queues["inference"].per_s is None and worker.tokens_per_s is None  # not < 0
    assert worker.queues["inference"].succeeded == 3  # the new process's own count
    steady = worker_figures("inference", 7, True, old)
    assert steady is not None and steady.queues["inference"].per_s == 10.0


def test_each_process_start_writes_a_file_of_its_own(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    telemetry = tm.setup_telemetry(settings, "inference", export_interval_s=60)
    try:
        tm.record_inference_row(100, 1.0)
        telemetry.flush()
    finally:
        telemetry.shutdown()
    pid = os.getpid()
    started = int(psutil.Process().create_time() * 1000)
    assert telemetry.jsonl_path == tmp_path / "telemetry" / f"inference-{pid}-{started}.jsonl"
    # an earlier process of the same pid (a container restarted) left its file: still written
    # to within the live window, it is not the worker now
    earlier = tmp_path / "telemetry" / f"inference-{pid}-{started - 60_000}.jsonl"
    earlier.write_text(json.dumps(snapshot(time.time(), 5000, 900000)) + "\n")
    worker = tm.read_live_figures(settings)[f"inference-{pid}"]
    assert worker.queues == {} and worker.rss_mb is not None  # this process's figures


def test_of_the_earlier_starts_of_a_pid_the_latest_file_is_kept(tmp_path: Path) -> None:
    # a worker restarted every few hours (out of memory) in a container, same pid each time,
    # filled its pod's state dir with a file per start; the latest earlier one holds the spans
    # a run profile needs across one restart
    pid = os.getpid()
    started = int(psutil.Process().create_time() * 1000)
    folder = tmp_path / "telemetry"
    folder.mkdir()
    files = {
        "first": f"sandbox-{pid}-{started - 7_200_000}.jsonl",
        "first rotated": f"sandbox-{pid}-{started - 7_200_000}.jsonl.1",
        "legacy": f"sandbox-{pid}.jsonl",  # an earlier release's name: the earliest start
        "previous": f"sandbox-{pid}-{started - 3_600_000}.jsonl",
        "another pid": f"sandbox-{pid + 1}-{started - 7_200_000}.jsonl",
        "another service": f"inference-{pid}-{started - 7_200_000}.jsonl",
    }
    for name in files.values():
        (folder / name).write_text("")
    telemetry = tm.setup_telemetry(Settings(home=tmp_path), "sandbox", export_interval_s=60)
    telemetry.shutdown()
    assert telemetry.jsonl_path is not None
    kept = {name for name in files.values() if (folder / name).exists()}
    assert kept == {files["previous"], files["another pid"], files["another service"]}
