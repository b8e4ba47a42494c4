"""Host side of the harness protocol, shared by the process-based backends (local, gvisor).

`run_harness(argv, job)` starts the sandbox command (which must end by running `harness.py`),
sends the job with a fresh nonce on stdin, captures stdout/stderr up to the output limit while
draining the rest, reads the verdict pipe, kills the whole sandbox at the deadline, and
returns a `HarnessOutcome` that maps to an `ExecutionResult`:

- a verdict signed with the run's nonce decides passed/failed/error/memory_exceeded;
- no verdict: deadline or SIGXCPU (the CPU limit) → timeout; cgroup OOM → memory_exceeded; with tests →
  failed (the program ended or was killed before its tests reported); without tests → the
  exit status (0 passed, else failed);
- the harness never said it was ready → the platform failed: `SandboxInfraError`.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import json
import marshal
import os
import secrets
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import psutil

from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import SandboxLimits
from infra.sandbox.base import SandboxInfraError

Killer = Callable[[int], Awaitable[None] | None]
"""Backend hook that kills a sandbox's inner processes, given the launcher's pid."""

READY_LINE = b'{"ready": True}'
"""What the harness writes once it has read its job, before any user code runs."""
VERDICT_CAP = 1 << 20
"""Bytes of the verdict stream kept (user code can write there too, without the nonce)."""
KILL_GRACE_S = 2.0
"""How long to wait for the sandbox to go away after SIGKILL before calling it an infra fault."""


def split_tests(tests: str, entry_point: str | None) -> list[dict[str, object]]:
    """Test units for the harness: each top-level `assert` is one test, other statements setup.

    Tests without a top-level assert run as one unit, which is itself the one test unless an
    entry point is given (then `check(entry_point)` is the test). Split here, on the trusted
    side, so the sandbox need not import `ast`.
    """
    if not tests:
        return []
    try:
        tree = ast.parse(tests)
    except SyntaxError:
        return [{"test": entry_point is None, "line": 1, "source": tests}]
    if not any(isinstance(stmt, ast.Assert) for stmt in tree.body):
        return [{"test": entry_point is None, "line": 1, "source": tests}]
    lines = tests.splitlines(keepends=True)
    units: list[dict[str, object]] = []
    for stmt in tree.body:
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
        source = "".join(lines[first - 1 : stmt.end_lineno])
        units.append({"test": isinstance(stmt, ast.Assert), "line": first, "source": source})
    return units


@dataclass
class HarnessJob:
    program: str
    tests: str
    entry_point: str | None
    limits: SandboxLimits
    rlimits: dict[str, tuple[int, int]] = field(default_factory=dict)
    nonce: str = field(default_factory=lambda: secrets.token_hex(32))

    def fields(self, verdict_fd: int) -> dict[str, object]:
        return {
            "program": self.program,
            "tests": self.tests,
            "entry_point": self.entry_point,
            "units": split_tests(self.tests, self.entry_point),
            "nonce": self.nonce,
            "rlimits": self.rlimits,
            "verdict_fd": verdict_fd,
        }

    def payload(self, verdict_fd: int) -> bytes:
        """The job as JSON (the harness reads JSON or marshal; JSON travels in pod env)."""
        return json.dumps(self.fields(verdict_fd)).encode()

    def packed(self, verdict_fd: int) -> bytes:
        """The job marshalled: what local/gVisor send, as the harness loads it without imports."""
        return marshal.dumps(self.fields(verdict_fd), 4)


@dataclass
class Capture:
    """One output stream: the first `limit` bytes, and whether more came."""

    limit: int
    data: bytearray = field(default_factory=bytearray)
    truncated: bool = False

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(1 << 16):
            room = self.limit - len(self.data)
            if len(chunk) > room:
                self.truncated = True
            if room > 0:
                self.data += chunk[:room]

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


@dataclass
class SplitCapture(Capture):
    """A stream that also carries the harness's lines (gVisor passes no extra fds): lines that
    start like a harness message go to `harness`, the rest is captured as usual."""

    harness: Capture = field(default_factory=lambda: Capture(VERDICT_CAP))
    pending: bytearray = field(default_factory=bytearray)

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(1 << 16):
            self.pending += chunk
            *lines, rest = self.pending.split(b"\n")
            self.pending = bytearray(rest)
            for line in lines:
                self._route(bytes(line) + b"\n")
            if len(self.pending) > 1 << 16:  # no newline in sight: plain output
                self._keep(bytes(self.pending))
                self.pending.clear()
        if self.pending:
            self._route(bytes(self.pending))

    def _route(self, line: bytes) -> None:
        if line.startswith((READY_LINE, b"{'nonce': ")):
            self.harness.data += line[: VERDICT_CAP - len(self.harness.data)]
        elif line != b"\n" or self.data:
            self._keep(line)

    def _keep(self, data: bytes) -> None:
        room = self.limit - len(self.data)
        if len(data) > room:
            self.truncated = True
        if room > 0:
            self.data += data[:room]


@dataclass
class HarnessOutcome:
    job: HarnessJob
    returncode: int | None
    timed_out: bool
    duration_ms: int
    stdout: Capture
    stderr: Capture
    verdict_stream: Capture

    def verdicts(self) -> tuple[bool, list[dict[str, object]]]:
        """Whether the harness started, and the verdicts signed with this run's nonce.

        Only lines that contain the nonce are parsed (as literals, never evaluated), so text
        the program wrote there is never even looked at.
        """
        ready, verdicts = False, []
        for line in bytes(self.verdict_stream.data).splitlines():
            ready = ready or line == READY_LINE
            if self.job.nonce.encode() not in line:
                continue
            with contextlib.suppress(ValueError, SyntaxError, MemoryError, RecursionError):
                message = ast.literal_eval(line.decode("utf-8", "replace"))
                if isinstance(message, dict) and message.get("nonce") == self.job.nonce:
                    verdicts.append(message)
        return ready, verdicts

    def result(
        self, backend: str, limits: SandboxLimits, enforcement: str, oom_killed: bool = False
    ) -> ExecutionResult:
        ready, verdicts = self.verdicts()
        status, passed, total, detail = self._status(ready, verdicts, oom_killed)
        return ExecutionResult(
            status=status,
            exit_code=self.returncode,
            duration_ms=self.duration_ms,
            stdout=self.stdout.text(),
            stderr=self.stderr.text(),
            truncated=self.stdout.truncated or self.stderr.truncated,
            tests_passed=passed,
            tests_total=total,
            backend=backend,
            limits=limits,
            enforcement=enforcement,
            detail=detail,
        )

    def _status(
        self, ready: bool, verdicts: list[dict[str, object]], oom_killed: bool
    ) -> tuple[ExecStatus, int, int, str]:
        job = self.job
        units = split_tests(job.tests, job.entry_point)
        total = (1 if job.entry_point else 0) + sum(bool(unit["test"]) for unit in units)
        if len(verdicts) == 1:
            verdict = verdicts[0]
            passed = int(verdict.get("tests_passed", 0))  # type: ignore[call-overload]
            total = int(verdict.get("tests_total", 0))  # type: ignore[call-overload]
            return (
                ExecStatus(str(verdict["status"])),
                passed,
                total,
                str(verdict.get("exc_type", "")),
            )
        if len(verdicts) > 1:
            return (
                ExecStatus.FAILED,
                0,
                total,
                "more than one verdict: the harness was tampered with",
            )
        if not ready:
            if self.timed_out:
                raise SandboxInfraError(f"the sandbox did not start within {job.limits.timeout_s}s")
            raise SandboxInfraError(
                f"the sandbox failed to start (exit {self.returncode}): {self.stderr.text()[-2000:]}"
            )
        if oom_killed:
            return ExecStatus.MEMORY_EXCEEDED, 0, total, "killed by the memory limit"
        if self.timed_out:
            return ExecStatus.TIMEOUT, 0, total, f"wall-clock deadline of {job.limits.timeout_s}s"
        if self.returncode in (-signal.SIGXCPU, 128 + signal.SIGXCPU):
            return ExecStatus.TIMEOUT, 0, total, f"CPU limit of {job.limits.cpu_s}s"
        if job.tests or job.entry_point:
            return ExecStatus.FAILED, 0, total, "the program exited before its tests reported"
        if self.returncode == 0:
            return ExecStatus.PASSED, 0, 0, ""
        return ExecStatus.FAILED, 0, 0, f"exit status {self.returncode}"


async def run_harness(
    argv: list[str],
    job: HarnessJob,
    kill: Killer | None = None,
    env: dict[str, str] | None = None,
    verdict_on_stderr: bool = False,
) -> HarnessOutcome:
    """Start the sandbox command `argv` and run `job` in it (see `Sandbox`)."""
    sandbox = await Sandbox.spawn(argv, env, verdict_on_stderr)
    return await sandbox.run(job, kill)


@dataclass
class Sandbox:
    """One started sandbox whose harness waits for its job on stdin; it runs one job, ever.

    The harness reports on a pipe passed as an extra fd, or (`verdict_on_stderr`, for runtimes
    that pass stdio only) on stderr, whence its lines are split off. Nothing of a job exists in
    the sandbox before `run`, so a sandbox may be started ahead of time (the local backend's
    warm pool) without weakening isolation between runs.
    """

    process: asyncio.subprocess.Process
    verdict_reader: asyncio.StreamReader
    transport: asyncio.ReadTransport
    verdict_fd: int
    verdict_on_stderr: bool

    @classmethod
    async def spawn(
        cls, argv: list[str], env: dict[str, str] | None = None, verdict_on_stderr: bool = False
    ) -> Sandbox:
        read_fd, write_fd = os.pipe()
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                pass_fds=(write_fd,),
                start_new_session=True,
                env=env if env is not None else {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            )
        except OSError as exc:
            os.close(read_fd)
            raise SandboxInfraError(f"cannot start {argv[0]}: {exc}") from exc
        finally:
            os.close(write_fd)
        reader = asyncio.StreamReader(limit=VERDICT_CAP)
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb", 0)
        )
        fd = 2 if verdict_on_stderr else write_fd
        return cls(process, reader, transport, fd, verdict_on_stderr)  # type: ignore[arg-type]

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    async def run(self, job: HarnessJob, kill: Killer | None = None) -> HarnessOutcome:
        """Send `job`, collect its output until exit or deadline, and kill what is left."""
        process, limit = self.process, job.limits.output_bytes
        stdout = Capture(limit)
        stderr = SplitCapture(limit) if self.verdict_on_stderr else Capture(limit)
        verdict = stderr.harness if isinstance(stderr, SplitCapture) else Capture(VERDICT_CAP)
        assert process.stdin and process.stdout and process.stderr
        readers = asyncio.gather(
            stdout.drain(process.stdout),
            stderr.drain(process.stderr),
            (Capture(0) if self.verdict_on_stderr else verdict).drain(self.verdict_reader),
        )
        started, timed_out = time.monotonic(), False
        try:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                process.stdin.write(job.packed(self.verdict_fd))
                await process.stdin.drain()
                process.stdin.close()
            await asyncio.wait_for(asyncio.shield(readers), timeout=job.limits.timeout_s)
            left = started + job.limits.timeout_s - time.monotonic()
            await asyncio.wait_for(process.wait(), timeout=max(left, 0.05))
        except TimeoutError:
            timed_out = True
        finally:
            duration_ms = int((time.monotonic() - started) * 1000)
            try:
                await self.stop(kill)
                await asyncio.wait_for(readers, timeout=KILL_GRACE_S)
            except TimeoutError as exc:
                readers.cancel()
                raise SandboxInfraError("the sandbox did not die after SIGKILL") from exc
        return HarnessOutcome(
            job, process.returncode, timed_out, duration_ms, stdout, stderr, verdict
        )

    async def stop(self, kill: Killer | None = None) -> None:
        """Kill the sandbox from the inside out, so the launcher reaps its own children.

        Killing the launcher (bwrap) first would orphan its pid-1 init to the host's init, which
        may never reap it; so kill its descendants (and the backend's own notion of the sandbox:
        a cgroup, a gVisor container), let the launcher exit by itself, and SIGKILL it last.
        """
        process = self.process
        try:
            if process.returncode is None:
                with contextlib.suppress(psutil.Error):
                    for child in psutil.Process(process.pid).children(recursive=True):
                        with contextlib.suppress(psutil.Error):
                            child.kill()
                if kill is not None and inspect.isawaitable(killed := kill(process.pid)):
                    await killed
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), timeout=KILL_GRACE_S / 2)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            await asyncio.wait_for(process.wait(), timeout=KILL_GRACE_S)
        finally:
            self.transport.close()
