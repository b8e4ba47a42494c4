"""The one rule for names that carry a worker's pid (`<pid>-...`): whether a dead worker's.

`infra.processes.dead_worker_name` is what the sandbox's sweep (`sweep_dead_workers`: run groups,
gVisor and shell directories) and the vLLM engine's (`sweep_dead_ipc_dirs`) both ask, their
directories through one sweep (`sweep_dead_worker_dirs`):
- without a pid: a name whose leading pid has no process is dead; a live one's is not, nor a
  name that does not begin with digits and a dash's worth of pid;
- with the pid of a worker the caller knows is dead: that worker's names, not another's;
- the inference worker asks it without loading the sandbox package.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from infra.processes import dead_worker_name

ROOT = Path(__file__).resolve().parents[2]


def dead_pid() -> int:
    """A pid with no process: a child that exited and was reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert not Path(f"/proc/{child.pid}").exists()
    return child.pid


def test_a_name_is_dead_when_no_process_has_its_pid() -> None:
    dead, live = dead_pid(), os.getpid()
    assert dead_worker_name(f"{dead}-3")
    assert dead_worker_name(f"{dead}-k3j2h1gf-more")
    assert not dead_worker_name(f"{live}-3")
    for foreign in (f"x{dead}-3", f"{dead}", "abc-3", f"-{dead}-3", ""):
        assert not dead_worker_name(foreign), foreign


def test_a_named_dead_worker_owns_its_own_names_only() -> None:
    dead, live = dead_pid(), os.getpid()
    # the caller knows `live` is dead (its pid is given): its names go, whatever /proc says
    assert dead_worker_name(f"{live}-3", live)
    assert dead_worker_name(f"{dead}-3", dead)
    assert not dead_worker_name("abc-3", live)
    assert not dead_worker_name(f"{dead}", dead)


def test_the_inference_worker_asks_without_loading_the_sandbox() -> None:
    code = (
        "import sys, infra.inference.vllm_engine as e\n"
        "assert e.sweep_dead_worker_dirs\n"
        "print(sorted(m for m in sys.modules if m.startswith('infra.sandbox')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
