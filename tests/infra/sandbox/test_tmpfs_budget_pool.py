"""A gVisor candidate's tmpfs (its /tmp and /dev/shm) is `tmpfs_mb` but at most `memory_mb`
(`launcher.candidate_tmpfs_mb`: only the address-space cap holds the program there, and it
counts no file), and the warm pool is keyed by that size: at the default limits (memory above
the tmpfs) every run shares one key and is served by a warm container, and a run of 64 MB with
a /tmp of 256 MB is served by the same 64 MB containers. Locally the size stays `tmpfs_mb`
(the memory cgroup charges files). Real runsc containers, as the verifier starts them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox.launcher import candidate_tmpfs_mb
from tests.infra.sandbox.verifier_box import FAST, Box, gvisor_missing

SIZE = "import os\ns = os.statvfs('/tmp')\nprint(s.f_blocks * s.f_frsize >> 20)\n"
"""Print the size of the run's /tmp, in MiB."""


def test_only_a_held_candidates_tmpfs_is_bounded_by_its_memory() -> None:
    defaults = SandboxLimits()
    assert defaults.memory_mb >= defaults.tmpfs_mb  # so the pool's key is `tmpfs_mb` by default
    assert candidate_tmpfs_mb(defaults, held=True) == defaults.tmpfs_mb
    small = SandboxLimits(memory_mb=64, tmpfs_mb=256)
    assert candidate_tmpfs_mb(small, held=True) == 64
    assert candidate_tmpfs_mb(small) == 256  # local: the memory cgroup counts the files


@pytest.fixture(scope="module")
def gvisor() -> Iterator[Box]:
    if reason := gvisor_missing():
        pytest.skip(reason)
    box = Box("gvisor", warm=2)
    yield box
    box.close()


def _filled(box: Box, key: int, tries: int = 3) -> list[object]:
    """The pool's pairs of `key` once its fills are done (a container starts in ~0.5 s). A fill
    the host's load failed (its container not started in time: the verifier leaves the fault to
    the next run that needs a pair) is asked again, up to `tries` rounds: in one CI run at load
    3.8 the pool stayed empty."""

    async def refill() -> None:
        box.verifier._refill(key)

    pool: list[object] = []
    for _ in range(tries):
        for _ in range(100):
            box.settle()
            if not box.verifier._fills:
                break
        pool = list(box.verifier._pool.get(key, []))
        if len(pool) >= box.verifier.warm:
            break
        box.loop.run_until_complete(refill())
    return pool


def test_the_warm_pool_serves_runs_at_the_default_limits(gvisor: Box) -> None:
    key = candidate_tmpfs_mb(FAST, held=True)
    first = gvisor.run(SIZE, limits=FAST)
    assert first.status == ExecStatus.PASSED and first.stdout == f"{FAST.tmpfs_mb}\n", first
    for _ in range(2):
        pool = _filled(gvisor, key)
        assert len(pool) == 2, gvisor.verifier._pool
        result = gvisor.run(SIZE, limits=FAST)
        assert result.status == ExecStatus.PASSED and result.stdout == f"{FAST.tmpfs_mb}\n"
        assert pool[1] not in gvisor.verifier._pool.get(key, [])  # it served this run: a hit
        assert pool[0] in gvisor.verifier._pool[key]  # a live pair, still waiting


def test_a_warm_container_of_the_runs_size_serves_a_small_memory(gvisor: Box) -> None:
    """memory 64 MB, tmpfs 256 MB: the 64 MB containers of the default limits serve it, and
    its /tmp holds 64 MB; memory 48 MB: a container of its own size (no pool has one yet)."""
    small = SandboxLimits(timeout_s=5, memory_mb=64, tmpfs_mb=256)
    assert candidate_tmpfs_mb(small, held=True) == FAST.tmpfs_mb
    pool = _filled(gvisor, FAST.tmpfs_mb)
    assert pool, gvisor.verifier._pool
    result = gvisor.run(SIZE, limits=small)
    assert result.status == ExecStatus.PASSED and result.stdout == "64\n", result
    assert pool[-1] not in gvisor.verifier._pool.get(FAST.tmpfs_mb, [])  # served from the pool
    smaller = SandboxLimits(timeout_s=5, memory_mb=48, tmpfs_mb=256)
    result = gvisor.run(SIZE, limits=smaller)
    assert result.status == ExecStatus.PASSED and result.stdout == "48\n", result
