"""The host's ends of a verifier run's channels (`verifier.py`): the candidate's output pipes,
captured as they come, and the checker's job socket (the job out, length-prefixed frames in,
decoded by `codec.py`, which cannot run code).

Once a stream's capture is full, its pipe is no longer read on every write: it is emptied
every `DRAIN_S` (its size raised to `FULL_PIPE_BYTES`), so a flood costs the worker a read of
what came every 10 ms, not a wake-up per write (about one CPU core for the run's length, four
writers measured); a program that writes faster than ~100 MB/s waits for the drain, its own
doing (its output is past what is kept; the deadline is its own time), and never deadlocks.

Not covered: the channels inside the sandbox (checker to candidate), which are `checker.py`'s
and `candidate.py`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import socket

from infra.sandbox import codec
from infra.sandbox.process import Capture

DRAIN_S = 0.01
"""How often the pipe of a full capture is emptied (see the module doc)."""
FULL_PIPE_BYTES = 1 << 20
"""The pipe's size once its capture is full (Linux's default pipe-max-size): a drain every
`DRAIN_S` then passes ~100 MB/s before a writer waits."""


class OutputPipe(asyncio.Protocol):
    """One output pipe of the candidate, captured as it comes (so the program never blocks on
    a full pipe) up to the capture's limit, then drained every `DRAIN_S`."""

    def __init__(self, fd: int, capture: Capture) -> None:
        self.fd, self.capture = fd, capture
        self.loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self.loop.create_future()
        self.transport: asyncio.ReadTransport | None = None
        self._drain: asyncio.TimerHandle | None = None
        self._enlarged = False

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
        if self.capture.truncated and self._drain is None and self.transport is not None:
            self.transport.pause_reading()  # until the next drain
            if not self._enlarged:
                self._enlarged = True
                with contextlib.suppress(OSError):  # over the user's pipe quota: as it was
                    fcntl.fcntl(self.fd, fcntl.F_SETPIPE_SZ, FULL_PIPE_BYTES)
            self._drain = self.loop.call_later(DRAIN_S, self._drain_now)

    def _drain_now(self) -> None:
        """Read what the pipe holds now (one read: at most its size), then wait for the next
        write (at the end, resumed, the transport sees it)."""
        self._drain = None
        with contextlib.suppress(BlockingIOError, OSError):
            self.capture.add(os.read(self.fd, FULL_PIPE_BYTES))
        if self.transport is not None:
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_draining()
        if not self.closed.done():
            self.closed.set_result(None)

    def _stop_draining(self) -> None:
        if self._drain is not None:
            self._drain.cancel()
            self._drain = None

    def take_the_rest(self) -> None:
        """Read what is in the pipe now (at most its size: a thread may still be writing),
        without waiting for the writers to end; its last bytes are the latest the capture
        keeps (a full capture's pipe holds up to a drain's worth)."""
        with contextlib.suppress(BlockingIOError, OSError):
            left = fcntl.fcntl(self.fd, fcntl.F_GETPIPE_SZ)
            while left > 0 and (chunk := os.read(self.fd, left)):
                self.capture.add(chunk)
                left -= len(chunk)

    def close(self) -> None:
        self._stop_draining()
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
