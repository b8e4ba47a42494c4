"""One rule for a sandbox's rlimits (`launcher.candidate_rlimits`), set three ways: by a host
candidate on itself, by a Kubernetes pod's candidate (no RLIMIT_NPROC), and by the shell that
launches a workspace command (as `ulimit` flags, read back here from a real /bin/sh, and from
dash and bash started as /bin/sh: the flag for processes is -p in one, -u in the other)."""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.task import SandboxLimits
from infra.sandbox.cgroups import MB
from infra.sandbox.kubernetes_job import sandbox_rlimits
from infra.sandbox.launcher import candidate_rlimits
from infra.sandbox.workspace import WRAPPER_PROCESSES, CommandRunner, Mounts, workspace_rlimits

LIMITS = [SandboxLimits(), SandboxLimits(memory_mb=1024, cpu_s=7, file_size_mb=3, max_processes=5)]
READ_BACK = (
    "import json, resource\n"
    "names = ['RLIMIT_CPU', 'RLIMIT_FSIZE', 'RLIMIT_CORE', 'RLIMIT_NPROC', 'RLIMIT_AS']\n"
    "print(json.dumps({n: resource.getrlimit(getattr(resource, n)) for n in names}))\n"
)


class StubCgroups:
    """Cgroups whose `cgroup.procs` files are plain files: the shell's joins write there."""

    cpuacct: Path | None = None  # no CPU count: the runner joins none

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def procs_files(self) -> list[Path]:
        return [self.directory / "cgroup.procs"]


def shell_rlimits(
    limits: SandboxLimits, cgroups: StubCgroups | None, shell: str
) -> dict[str, list[int]]:
    """The limits a workspace command starts with: `CommandRunner.argv`'s launching shell, run
    by `shell` (named /bin/sh, as bash then reads POSIX units) with a Python that prints them in
    place of setpriv and bwrap."""
    runner = CommandRunner()
    runner.bwrap, runner.setpriv, runner.root = "bwrap", "setpriv", False
    argv = runner.argv("true", Mounts(Path("/nowhere")), 12345, limits, cgroups, 3, 4)  # type: ignore[arg-type]
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3] == "sandbox"
    line = [*argv[:4], sys.executable, "-S", "-c", READ_BACK]
    done = subprocess.run(
        line, executable=shell, capture_output=True, text=True, timeout=30, check=True
    )
    return json.loads(done.stdout)


def test_a_kubernetes_candidate_has_the_host_rule_without_nproc() -> None:
    for limits in LIMITS:
        held = candidate_rlimits(limits, cgroups=True, nproc=False, space_held=True)
        assert sandbox_rlimits(limits) == held  # its address space within what its pod holds
        assert "RLIMIT_NPROC" not in sandbox_rlimits(limits)


@pytest.mark.parametrize("shell", ["/bin/sh", "dash", "bash"])
@pytest.mark.parametrize("cgroups", [False, True])
def test_the_workspace_shell_sets_the_candidates_rule(
    cgroups: bool, shell: str, tmp_path: Path
) -> None:
    """CPU (SIGXCPU a second before SIGKILL), file size, no core: the candidate's; processes:
    the command's plus bwrap's two; address space: the candidate's without cgroups, none with
    them (the memory cgroup bounds a workspace command, which may be any program)."""
    if (found := shutil.which(shell)) is None:
        pytest.skip(f"no {shell} here")
    for limits in LIMITS:
        rule = candidate_rlimits(limits, cgroups)
        seen = shell_rlimits(limits, StubCgroups(tmp_path) if cgroups else None, found)
        for name, value in workspace_rlimits(limits, cgroups).items():  # flags and units
            assert tuple(seen[name]) == value, name
        for name in ("RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_CORE"):
            assert tuple(seen[name]) == rule[name], name
        assert seen["RLIMIT_CPU"] == [limits.cpu_s, limits.cpu_s + 1]
        assert seen["RLIMIT_FSIZE"] == [limits.file_size_mb * MB] * 2
        assert seen["RLIMIT_NPROC"] == [limits.max_processes + WRAPPER_PROCESSES] * 2
        if cgroups:  # left as the worker's
            assert tuple(seen["RLIMIT_AS"]) == resource.getrlimit(resource.RLIMIT_AS)
        else:
            assert tuple(seen["RLIMIT_AS"]) == rule["RLIMIT_AS"] == (limits.memory_mb * MB,) * 2
