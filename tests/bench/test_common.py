"""bench/common.py's shared rules: the percentile every bench reports, the idle check and the
stamp that tells run_all a fresh entry from an old one."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest


def test_the_p99_of_a_hundred_latencies_is_the_99th_not_the_largest() -> None:
    from concurrency import percentile  # the one bench/concurrency.py reports with

    values = [float(v) for v in range(100, 0, -1)]
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 1.0) == 100.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert math.isnan(percentile([], 0.5))


class Fake:
    """A machine whose load average, busy CPU and the bench's own CPU the test sets."""

    def __init__(self) -> None:
        self.load, self.busy, self.own, self.now = 0.0, 100.0, 10.0, 0.0

    def guard(self) -> object:
        from common import IdleGuard

        return IdleGuard(
            load=lambda: self.load,
            busy_s=lambda: self.busy,
            own_s=lambda: self.own,
            clock=lambda: self.now,
            cpus=2,
        )


def test_a_bench_refuses_to_start_on_a_busy_machine_unless_allowed() -> None:
    fake = Fake()
    fake.load = 1.2  # 0.6 a core
    with pytest.raises(SystemExit, match="busy at start"):
        fake.guard().require(allow_busy=False)
    allowed = fake.guard()
    allowed.require(allow_busy=True)
    record = allowed.record()
    assert record["busy"] is True and record["idle_checks"][0]["load_per_core"] == 0.6


def test_a_side_is_judged_by_the_other_processes_cpu_not_by_its_own() -> None:
    fake = Fake()
    guard = fake.guard()
    guard.require(allow_busy=False)
    with guard.side("own work only"):  # the bench keeps both cores busy for 10 s
        fake.now, fake.busy, fake.own, fake.load = 10.0, 120.0, 30.0, 2.0
    assert guard.record()["busy"] is False
    with pytest.raises(SystemExit, match="busy at others"), guard.side("others"):
        # 10 s: the machine busy 18 CPU seconds, 6 of them the bench's: 0.6 a core others'
        fake.now, fake.busy, fake.own = 20.0, 138.0, 36.0
    check = guard.record()["idle_checks"][-1]
    assert check["when"] == "others" and check["others_cpu_per_core"] == 0.6 and check["busy"]


def test_results_are_stamped_with_when_they_were_measured(tmp_path: Path) -> None:
    from common import merge_results

    path = tmp_path / "results.json"
    merge_results("demo", {"figure": 1}, path)
    entry = json.loads(path.read_text())["demo"]
    assert entry["figure"] == 1 and entry["measured_at"]
