"""`read_file` from a line deep in a long file takes time linear in the file (on real bwrap).

Before, each line skipped to reach `start_line` counted the newlines of the rest of its 1 MiB
chunk: quadratic in `start_line` (40,000 lines 1.06 s, 400,000 over 120 s)."""

from __future__ import annotations

import time

import pytest

from contracts.task import SandboxLimits
from infra.environments.file_tools import read_file
from tests.infra.environments.conftest import Rig, needs_root

LIMITS = SandboxLimits(timeout_s=5)
LINES = [f"{i:05x}\n" for i in range(1, 250_001)]  # 1.5 MB: a chunk (1 MiB) and a half
"""Line n is `n` in hex: line 174,763 lies across the first chunk's end (6 bytes a line)."""


@needs_root
@pytest.mark.asyncio
async def test_reading_from_a_deep_line_is_linear_and_exact_across_chunks(rig: Rig) -> None:
    await rig.env.reset(rig.spec({"many.txt": "".join(LINES)}), "s0")
    session = rig.host.sessions["s0"]
    began = time.monotonic()
    for first, last in [(174_762, 174_764), (174_763, 174_763), (249_990, None), (2, 3)]:
        seen = read_file(session, "many.txt", LIMITS, first, last)
        shown = LINES[first - 1 : last]
        end = first + len(shown) - 1
        assert seen.text == f"[many.txt: lines {first}-{end} of 250000]\n" + "".join(shown)
    # linear: well under a second here; the quadratic skip took minutes
    assert time.monotonic() - began < 5
