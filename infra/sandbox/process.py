"""Host-side pieces shared by whatever watches a sandboxed process: output capture, kill grace.

    stdout = Capture(limits.output_bytes)
    await stdout.drain(process.stdout)         # or stdout.add(chunk) as chunks arrive
    stdout.text(), stdout.truncated

Used by the verifier (`verifier.py`, `judge.py`) and the workspace runner (`workspace.py`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

KILL_GRACE_S = 2.0
"""How long a SIGKILLed sandbox may take to go away before that is a platform fault."""


@dataclass
class Capture:
    """One output stream: the first `limit` bytes, and whether more came."""

    limit: int
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    def add(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        self.truncated = self.truncated or len(chunk) > room
        self.data += chunk[: max(room, 0)]

    async def drain(self, stream: asyncio.StreamReader) -> None:
        """Read `stream` to its end, keeping what fits."""
        while chunk := await stream.read(1 << 16):
            self.add(chunk)

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")
