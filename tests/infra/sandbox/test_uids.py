"""Sandbox uids: no two live workers share one (a verifier's block is claimed, not only derived
from its pid), and the verifier's and the workspaces' ranges are apart and fit a uid."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from infra.sandbox import forkserver
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.forkserver import SANDBOX_UID_RANGE, WORKER_BLOCKS
from infra.sandbox.workspace import SESSION_UID_BASE, SLOTS, session_uid

PID_MAX_LIMIT = 1 << 22
"""The largest pid_max Linux allows (64-bit)."""
WORKER = """
import os, sys
os.getpid = lambda: int(sys.argv[1])
from infra.sandbox.forkserver import worker_uids
uids = worker_uids()
print(uids.start, uids.stop, flush=True)
sys.stdin.read()
"""


def live_blocks(*pids: int) -> list[range]:
    """The uid blocks of workers with these pids, all alive at once."""
    workers: list[subprocess.Popen[str]] = []
    blocks = []
    try:
        for pid in pids:  # one after another: each claims with the ones before it alive
            command = [sys.executable, "-c", WORKER, str(pid)]
            worker = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            workers.append(worker)
            assert worker.stdout is not None
            start, stop = map(int, worker.stdout.readline().split())
            blocks.append(range(start, stop))
        return blocks
    finally:
        for worker in workers:
            worker.communicate("", timeout=30)


def test_live_workers_whose_pids_share_a_block_index_share_no_uid() -> None:
    """With one block per pid % 512, workers 5 and 517 ran their candidates under the same uids:
    one's processes counted against the other's RLIMIT_NPROC (its forks failed: a wrong
    verdict), and the two shared the uid's keyring."""
    blocks = live_blocks(5, 5 + WORKER_BLOCKS)
    assert not set(blocks[0]) & set(blocks[1]), blocks
    assert all(block.start in SANDBOX_UID_RANGE and block.stop <= SANDBOX_UID_RANGE.stop
               for block in blocks)  # fmt: skip
    assert live_blocks(5 + WORKER_BLOCKS) == blocks[:1]  # its worker gone, a block is free


def test_with_every_block_held_a_worker_is_told_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forkserver, "WORKER_BLOCKS", 2)
    monkeypatch.setattr(forkserver, "BLOCK_CLAIM", f"\0tempered-test-{os.getpid()}-{{}}")
    held = [forkserver._claim_block(0)[1], forkserver._claim_block(0)[1]]
    try:
        with pytest.raises(SandboxInfraError, match="hold all 2 blocks"):
            forkserver._claim_block(0)
    finally:
        for holder in held:
            holder.close()


def test_the_ranges_are_apart_and_fit_a_uid() -> None:
    assert SANDBOX_UID_RANGE.stop <= SESSION_UID_BASE
    assert session_uid(SLOTS - 1, PID_MAX_LIMIT) < 2**32 - 1  # (uid_t) -1 is no uid
