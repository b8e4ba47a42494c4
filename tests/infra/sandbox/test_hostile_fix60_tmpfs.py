"""A verifier candidate's writable directories on every backend: /tmp and /dev/shm are one
tmpfs of `tmpfs_mb` (locally /dev/shm is a bind of /tmp, `confine.py`), so what a program keeps
in files is bounded once, as locally, not twice. On gVisor each was a tmpfs of `tmpfs_mb`
of its own, outside the program's address-space cap: twice the run's size in files.

On gVisor that tmpfs is at most `memory_mb` too (`launcher.candidate_tmpfs_mb`): the cap counts
no file, and locally the memory cgroup charges them, so a program of 64 MB writing 200 MB to a
256 MB /tmp passed there and was memory_exceeded locally. The warm pool is keyed by that size
(`test_tmpfs_budget_pool.py`: it still serves runs at the default limits)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from tests.infra.sandbox.verifier_box import Box, gvisor_missing

FILL = """
import os
def fill(path, megabytes):
    done = 0
    try:
        with open(path, 'wb') as handle:
            for _ in range(megabytes):
                handle.write(b'x' * (1 << 20))
                handle.flush()
                done += 1
    except OSError as exc:
        print(path, 'stopped', exc.errno == 28)
    else:
        print(path, 'wrote', done)
"""
WRITER = (
    FILL
    + """
fill('/tmp/a', 20)
fill('/dev/shm/b', 20)
print(sorted(name for name in os.listdir('/dev/shm') if not name.startswith('.')))
"""
)


def test_tmp_and_dev_shm_share_one_tmpfs_of_the_runs_size(any_box: Box) -> None:
    """20 MB in /tmp, then 20 MB more in /dev/shm under a tmpfs of 32 MB: the second stops with
    ENOSPC, and /dev/shm holds /tmp's file, on every backend."""
    limits = SandboxLimits(timeout_s=20, memory_mb=256, tmpfs_mb=32, file_size_mb=64)
    result = any_box.run(WRITER, limits=limits)
    assert result.status == ExecStatus.PASSED, result
    assert result.stdout.splitlines() == [
        "/tmp/a wrote 20",
        "/dev/shm/b stopped True",
        "['a', 'b']",
    ], result


def test_the_run_still_has_a_writable_tmp_and_shm(any_box: Box) -> None:
    """Both directories are writable, world-writable and sticky; the working directory and HOME
    are writable too (multiprocessing's locks need /dev/shm)."""
    program = (
        "import multiprocessing, os, tempfile\nmultiprocessing.Lock()\n"
        "open('here.txt', 'w').write('x')\nopen(os.path.expanduser('~/home.txt'), 'w').write('y')\n"
        "print(tempfile.gettempdir(), oct(os.stat('/tmp').st_mode & 0o7777),"
        " oct(os.stat('/dev/shm').st_mode & 0o7777), open('/tmp/here.txt').read())\n"
    )
    result = any_box.run(program, limits=SandboxLimits(timeout_s=10))
    assert result.status == ExecStatus.PASSED, result
    assert result.stdout == "/tmp 0o1777 0o1777 x\n", result


@pytest.fixture(scope="module")
def gvisor_box() -> Iterator[Box]:
    if reason := gvisor_missing():
        pytest.skip(reason)
    box = Box("gvisor", warm=0)
    yield box
    box.close()


def test_files_past_the_memory_limit_do_not_pass_on_gvisor(gvisor_box: Box) -> None:
    """200 MB of files for a program of 64 MB: its tmpfs is 64 MB, not `tmpfs_mb`'s 256."""
    program = FILL + "fill('/tmp/big', 200)\n"
    limits = SandboxLimits(timeout_s=10, memory_mb=64, tmpfs_mb=256, file_size_mb=512)
    result = gvisor_box.run(program, limits=limits)
    assert result.stdout.splitlines()[:1] == ["/tmp/big stopped True"], result  # ENOSPC
