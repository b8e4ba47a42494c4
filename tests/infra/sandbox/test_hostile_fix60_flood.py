"""An output flood past the capture costs the worker little CPU (`channels.OutputPipe`): once a
stream's capture is full its pipe is emptied every `DRAIN_S`, not on every write. Before, the
worker read and discarded as fast as four writers wrote: about one core for the run's length.
What is kept stays the stream's head and its latest bytes, and a program that writes a lot and
then ends is not held past its deadline for it."""

from __future__ import annotations

import time

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from tests.infra.sandbox.verifier_box import Box, needs_root

pytestmark = needs_root

FLOOD = """
import os
for _ in range(3):
    if os.fork() == 0:
        while True:
            os.write(1, b'x' * 65536)
while True:
    os.write(2, b'y' * 65536)
"""


def test_a_flood_costs_the_worker_little_cpu(box: Box) -> None:
    box.run("print(1)\n")  # the pool warm, the loop's first costs paid
    box.settle()
    limits = SandboxLimits(timeout_s=3, output_bytes=4096)
    cpu, wall = time.process_time(), time.monotonic()
    result = box.run(FLOOD, limits=limits)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    assert result.status == ExecStatus.TIMEOUT and result.truncated, result
    assert len(result.stdout) <= 4096 and result.stdout.startswith("xxxx"), result
    # before: 0.74 s of the worker's CPU per second of flood (2.98 s in 4.03 s); now ~0.08
    assert cpu < 0.3 * wall, f"the worker spent {cpu:.2f} s of CPU in {wall:.2f} s"


def test_the_latest_bytes_are_kept_and_a_long_output_ends_in_time(box: Box) -> None:
    """64 MB written then a last line: the program ends well within its deadline and the
    capture keeps its first bytes and that last line."""
    program = (
        "import os, sys\nfor _ in range(1024):\n    os.write(1, b'z' * 65536)\n"
        "sys.stdout.write('the last line\\n')\n"
    )
    limits = SandboxLimits(timeout_s=10, output_bytes=4096)
    started = time.monotonic()
    result = box.run(program, limits=limits)
    took = time.monotonic() - started
    assert result.status == ExecStatus.PASSED and result.truncated, result
    assert result.stdout.startswith("zzzz") and result.stdout.endswith("zzthe last line\n")
    assert f"of its {64 * 2**20 + 14} bytes left out" in result.stdout, result.stdout[1900:2200]
    assert took < 5, f"64 MB of output took {took:.1f} s"
