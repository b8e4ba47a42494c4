"""`tempered … | head`: once the reader has gone, the command stops quietly as Unix tools do
(exit 141, as a process SIGPIPE ended; nothing on stderr of it). It printed "tempered train:
[Errno 32] Broken pipe" and exited 1 (a rich table exited 1 quietly)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    "argv",
    [
        ["tasks", "ls", "starter"],  # a rich table
        ["train", "--preset", "tiny", "--run-id", "x", "--dry-run"],  # print() in the command
    ],
)
def test_a_closed_pipe_ends_the_command_quietly(tmp_path: Path, argv: list[str]) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line
    env = {
        **os.environ,
        "TEMPERED_HOME": str(tmp_path),
        "TEMPERED_S3__ENDPOINT": "http://127.0.0.1:1",  # the dry run's check: refused at once
    }
    try:
        done = subprocess.run(
            [sys.executable, "-m", "workers.cli", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env=env,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert "pipe" not in done.stderr.lower() and "Traceback" not in done.stderr, done.stderr
