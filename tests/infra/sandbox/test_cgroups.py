"""A run's cgroup walk survives a group vanishing under it (infra/sandbox/cgroups.py); the
dead workers' sweep takes their gVisor directories too.

runsc removes the sandbox group it made below a run's groups when its sandbox ends; a CI run saw
`kill_all` fail with FileNotFoundError while walking the groups at that moment. The walk here
is over a plain folder tree, the removal simulated at the scan of that one folder, so it needs
no root and no cgroup mount.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from infra.sandbox.cgroups import Cgroups, sweep_dead_workers


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


def test_the_sweep_removes_the_gvisor_dirs_of_dead_workers_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that died left its containers' bundles and runsc's state dir in the temp dir
    (only its launcher's `close` removed them): its pid names them, and the sweep removes
    them; a live worker's stay unless the caller says it is dead (`pid`), as do others'."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(Cgroups, "available", staticmethod(lambda: False))
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead, live = gone.pid, os.getpid()
    names = [
        f"tempered-gvisor-{dead}-ab12_cd",
        f"tempered-runsc-{dead}-0a1b2c3d",
        f"tempered-runsc-{dead}-probe-x1",
        f"tempered-gvisor-{live}-ef34_gh",
        f"tempered-runsc-{live}-4e5f6a7b",
        "tempered-gvisor-k6fm0p7a",  # no pid in its name: nobody's to sweep
        f"other-{dead}-x",
    ]
    for name in names:
        (tmp_path / name / "log").mkdir(parents=True)
    assert sweep_dead_workers() == 0  # no cgroups here: no run groups counted
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[3:])
    sweep_dead_workers(live)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[5:])
