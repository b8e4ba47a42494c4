"""The host's ends of a verifier run's channels (`verifier.py`): the candidate's output pipes,
captured as they come, and the checker's job socket (the job out, length-prefixed frames in,
decoded by `codec.py`, which cannot run code).

Not covered: the channels inside the sandbox (checker to candidate), which are `checker.py`'s
and `candidate.py`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

from infra.sandbox import codec
from infra.sandbox.process import Capture


class OutputPipe(asyncio.Protocol):
    """One output pipe of the candidate, captured as it comes (so the program never blocks on
    a full pipe) up to the capture's limit."""

    def __init__(self, fd: int, capture: Capture) -> None:
        self.fd, self.capture = fd, capture
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.ReadTransport | None = None

    @classmethod
    async def open(cls, fd: int, capture: Capture) -> OutputPipe:
        output = cls(fd, capture)
        pipe = os.fdopen(os.dup(fd), "rb", 0)  # shares the (non-blocking) open file with `fd`
        output.transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: output, pipe
        )
        return output

    def data_received(self, data: bytes) -> None:
        self.capture.add(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def take_the_rest(self) -> None:
        """Read what is in the pipe now (at most a pipe's worth past the capture's limit: a
        thread may still be writing), without waiting for the writers to end."""
        with contextlib.suppress(BlockingIOError, OSError):
            while chunk := os.read(self.fd, 1 << 16):
                self.data_received(chunk)
                if len(self.capture.data) >= self.capture.limit:
                    self.capture.truncated = True
                    return

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class JobSocket:
    """The host's end of a checker's job socket: the job out, then frames in."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.loop = sock, asyncio.get_running_loop()
        sock.setblocking(False)

    async def send(self, message: object) -> None:
        await self.loop.sock_sendall(self.sock, codec.frame(message))

    async def _exactly(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = await self.loop.sock_recv(self.sock, count - len(data))
            if not chunk:
                raise codec.CodecError("the checker closed its socket without a verdict")
            data += chunk
        return data

    async def next(self) -> object:
        return codec.decode(await self._exactly(codec.frame_length(await self._exactly(4))))
