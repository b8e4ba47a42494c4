"""A run's cgroup walk survives a group vanishing under it (infra/sandbox/cgroups.py).

runsc removes the sandbox group it made below a run's groups when its sandbox ends; a CI run saw
`kill_all` fail with FileNotFoundError while walking the groups at that moment. The walk here
is over a plain folder tree, the removal simulated at the scan of that one folder, so it needs
no root and no cgroup mount.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infra.sandbox.cgroups import Cgroups


def test_a_group_removed_while_the_pids_are_read_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = tmp_path / "memory" / "tempered" / "run-1"
    (run / "sandbox").mkdir(parents=True)
    (run / "cgroup.procs").write_text("11\n12\n")
    (run / "sandbox" / "cgroup.procs").write_text("13\n")
    assert Cgroups({"memory": run}).pids() == [11, 12, 13]
    scandir = os.scandir

    def gone_at_sandbox(path: str | Path = ".") -> object:
        if Path(path).name == "sandbox":
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", gone_at_sandbox)
    assert Cgroups({"memory": run}).pids() == [11, 12]


def test_the_runs_processes_are_moved_into_its_cpuacct_group_and_its_usage_counts(
    tmp_path: Path,
) -> None:
    """The candidate joins memory and pids itself; the host moves it into its cpuacct group,
    whose usage keeps the CPU of processes that exited (children nobody reaped) that a count
    over live processes misses. Plain files stand for the groups here."""
    memory, cpuacct = tmp_path / "memory", tmp_path / "cpuacct"
    memory.mkdir()
    (cpuacct / "sandbox").mkdir(parents=True)
    (memory / "cgroup.procs").write_text("11\n")
    (cpuacct / "cgroup.procs").write_text("")
    (cpuacct / "sandbox" / "cgroup.procs").write_text("12\n")  # runsc's group: left there
    (cpuacct / "cpuacct.usage").write_text("2500000000\n")
    cgroups = Cgroups({"memory": memory}, cpuacct)
    assert cgroups.cpu_used() == 2.5
    assert (cpuacct / "cgroup.procs").read_text() == "11"
    assert Cgroups({"memory": memory}).cpu_used() is None  # no separate cpuacct: not counted
