"""The two-process verifier: a trusted checker calls an untrusted candidate, data only.

    verifier = Verifier(launcher, name="local", warm=4)       # local.py, gvisor.py build one
    result = await verifier.run(program, tests, limits, "add", helpers, hidden_tests)
    await verifier.close()

Per run, two fresh processes, paired by two pipes and nothing else:

- the **checker** (`checker.py`), forked from the checker zygote (`forkserver.py`): runs as the
  worker's checker uid, in a bubblewrap sandbox with no network, holds the tests, the task's
  helpers and the verdict, and reports to this host over a socket only it holds;
- the **candidate** (`candidate.py`), started by the backend's `CandidateLauncher`: runs the
  model's program under its own uid (local: pid 1 of fresh namespaces, forked by the candidate
  zygote and confined by `confine.py`; gVisor: a fresh runsc container) and answers calls with
  plain data (`codec.py`).

The candidate holds exactly its ends of the two pipes and its output pipes to this host. It
cannot see, signal, ptrace or read the checker (another uid, another pid namespace or
kernel), and nothing but decoded plain data crosses from it to the checker, so no object,
frame, closure or memory of the grader is ever reachable from model code. The host counts the
test units itself, hidden ones included (`judge.split_tests`), and reports `passed` only when
the checker says every unit ran and passed and its counts equal the host's count (> 0 whenever
there are tests).

The host keeps the run's deadline while it waits for the checker's verdict (`verifier_job.py`:
the job a checker is sent, and that wait). A job no codec frame can carry raises `JobTooLarge`
(the same on every retry).

Warm pool: pairs are started ahead of time (per tmpfs size, `launcher.candidate_tmpfs_mb`: by
`memory_mb` too on gVisor), each serves one run and is then killed; nothing of a job exists in
a pair before its run, and nothing is reused across runs.
Needs root (namespaces, uids, cgroups), bwrap and setpriv; raises SandboxInfraError otherwise.

Not covered: the Kubernetes backend, whose pod runs its own checker and candidate
(`pod_launcher.py`) and is judged by the same `judge.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import socket
import time
from collections.abc import Coroutine
from dataclasses import dataclass

from contracts.sandbox import ExecutionResult
from contracts.task import SandboxLimits
from infra.sandbox import codec
from infra.sandbox.base import DEFAULT_LIMITS, JobTooLarge, SandboxInfraError
from infra.sandbox.cgroups import Cgroups, host_pid, sweep_dead_workers
from infra.sandbox.channels import OutputPipe
from infra.sandbox.forkserver import BLOCK_UIDS, ForkServer, checker_zygote_argv, worker_uids
from infra.sandbox.judge import Exit, Observed, expected_units, judge, split_tests, starvation_bound
from infra.sandbox.launcher import (
    CandidateLauncher,
    CandidateSpec,
    candidate_rlimits,
    candidate_tmpfs_mb,
)
from infra.sandbox.process import Capture
from infra.sandbox.verifier_job import VERDICT_GRACE_S, await_verdict, checker_job

_TAKEN_SLOTS: set[int] = set()
"""Uid slots held by any verifier of this process, until their run's processes are gone."""


@dataclass
class Pair:
    """A forked checker and candidate waiting for one job, and what the host holds of them."""

    run_id: int
    slot: int
    tmpfs_mb: int
    cgroups: Cgroups | None
    job: socket.socket
    stdout: int
    stderr: int
    checker_pid: int | None  # on this host (`cgroups.host_pid`), None if not found
    released: bool = False


class Verifier:
    """Runs programs against tests in checker/candidate pairs; one instance serves many runs."""

    def __init__(
        self,
        launcher: CandidateLauncher,
        python: str = "/usr/bin/python3",
        warm: int = 4,
        name: str = "local",
        slots: range = range(1, BLOCK_UIDS),
        own_kernel: bool = False,
    ) -> None:
        """`slots`: offsets in the worker's uid block (`worker_uids`) that candidates may use
        (also naming their cgroups); offset 0 is the checkers' uid. `own_kernel`: the launcher's
        sandbox runs a kernel of its own (gVisor's), whose memory its cgroups hold beside the
        program's and whose host threads run the program: the candidate's address space is then
        capped at what the sandbox holds for the program (`candidate_rlimits`' `space_held`), its
        files at `memory_mb` too (`candidate_tmpfs_mb`), and its wait for a CPU is its
        sandbox's threads' (`Cgroups.cpu_wait`)."""
        if slots.start < 1 or slots.stop > BLOCK_UIDS:
            raise ValueError(f"slots must lie within 1..{BLOCK_UIDS - 1}")
        self.launcher, self.python, self.warm, self.name = launcher, python, warm, name
        self.slots, self.own_kernel = slots, own_kernel
        self.bwrap, self.setpriv = shutil.which("bwrap"), shutil.which("setpriv")
        self.use_cgroups = Cgroups.available()
        self.enforcement = "cgroup" if self.use_cgroups else "rlimit"
        self._ids = itertools.count(1)
        self._pool: dict[int, list[Pair]] = {}
        self._filling: dict[int, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._fills: set[asyncio.Task[None]] = set()
        self._checker: ForkServer | None = None
        self._starting: asyncio.Lock | None = None

    def _started(self) -> ForkServer | None:
        checker = self._checker
        return checker if checker and checker.alive and self.launcher.alive else None

    async def _start(self) -> ForkServer:
        """The checker zygote and the candidate launcher, (re)started when either is down."""
        if checker := self._started():
            return checker
        self._starting = self._starting or asyncio.Lock()
        async with self._starting:
            if checker := self._started():
                return checker
            if os.geteuid() != 0 or not self.bwrap or not self.setpriv:
                raise SandboxInfraError(
                    f"the {self.name} sandbox needs root, bwrap and setpriv on this host"
                )
            if not os.path.exists(self.python):
                raise SandboxInfraError(f"the checkers' interpreter {self.python} is missing")
            await self._stop()
            await asyncio.to_thread(sweep_dead_workers)  # may wait for a kill
            checker_uid = worker_uids().start  # the block is claimed at the first start
            argv = checker_zygote_argv(self.python, checker_uid, self.bwrap, self.setpriv)
            checker = ForkServer("checker", argv)
            started = [checker.start(), self.launcher.start()]
            failed = [e for e in await asyncio.gather(*started, return_exceptions=True) if e]
            if failed:
                await asyncio.gather(checker.close(), self.launcher.close())
                raise failed[0]
            self._checker = checker
            return checker

    def _take_slot(self) -> int:
        """The lowest uid slot no verifier of this process holds (slot = uid and cgroup name)."""
        for slot in self.slots:
            if slot not in _TAKEN_SLOTS:
                _TAKEN_SLOTS.add(slot)
                return slot
        raise SandboxInfraError(f"more than {len(self.slots)} concurrent runs in one worker")

    async def _prepare(self, tmpfs_mb: int) -> Pair:
        """Fork a checker (first) and a candidate for one run, joined by two pipes."""
        checker = await self._start()
        slot, run_id = self._take_slot(), next(self._ids)
        cgroups: Cgroups | None = None
        fds: list[int] = []  # every fd made here
        ours: set[int] = set()  # those the host keeps
        try:
            name = f"{os.getpid()}-{slot}"
            cgroups = Cgroups.create(name, self.own_kernel) if self.use_cgroups else None
            for _ in range(4):
                fds += os.pipe()
            fds += [end.detach() for end in socket.socketpair()]
            calls_r, calls_w, replies_r, replies_w, out_r, out_w, err_r, err_w, job, job_child = fds
            spec = CandidateSpec(worker_uids().start + slot, tmpfs_mb, cgroups)
            inner, _ = await asyncio.gather(  # the checker's fork is asked for first
                checker.fork(run_id, None, [job_child, calls_w, replies_r]),
                self.launcher.fork(run_id, spec, [calls_r, replies_w, out_w, err_w]),
            )
            ours = {job, out_r, err_r}
            pid = host_pid(checker.process.pid, inner) if checker.process else None
            sock = socket.socket(fileno=job)
            return Pair(run_id, slot, tmpfs_mb, cgroups, sock, out_r, err_r, pid)
        except BaseException:
            await self._abandon(run_id, slot, cgroups)
            raise
        finally:
            for fd in fds:
                if fd not in ours:
                    os.close(fd)

    async def run(
        self,
        program: str,
        tests: str = "",
        limits: SandboxLimits = DEFAULT_LIMITS,
        entry_point: str | None = None,
        helpers: str = "",
        hidden_tests: str = "",
    ) -> ExecutionResult:
        """Run `program` against `tests` and `hidden_tests` (with the task's `helpers` on the
        checker's side)."""
        units = split_tests(tests, entry_point, hidden_tests)
        tmpfs_mb = candidate_tmpfs_mb(limits, held=self.own_kernel)  # the pool's key too
        pair = self._take_warm(tmpfs_mb) or await self._prepare(tmpfs_mb)
        if self.warm:
            self._refill(tmpfs_mb)
        rlimits = candidate_rlimits(limits, pair.cgroups is not None, space_held=self.own_kernel)
        bound = starvation_bound(limits.timeout_s) + VERDICT_GRACE_S  # the host decides first
        job = checker_job(program, tests, helpers, units, entry_point, limits, rlimits, bound)
        try:
            seen = await self._execute(pair, job, limits)
        except codec.NotPlainData as exc:  # the job's frame: the same on every retry
            raise JobTooLarge(f"program + tests do not fit the checker's channel: {exc}") from None
        finally:
            self._spawn(self._release(pair))
        return judge(seen, expected_units(units, entry_point), limits, self.name, self.enforcement)

    async def _execute(self, pair: Pair, job: dict[str, object], limits: SandboxLimits) -> Observed:
        launcher, cgroups = self.launcher, pair.cgroups
        if cgroups is not None:
            cgroups.apply(limits, launcher.memory_overhead_mb, launcher.processes_overhead)
        stdout = Capture(limits.output_bytes, name="stdout")
        stderr = Capture(limits.output_bytes, name="stderr")
        outputs = [
            await OutputPipe.open(pair.stdout, stdout),
            await OutputPipe.open(pair.stderr, stderr),
        ]
        started = time.monotonic()
        try:
            verdict, deadline = await await_verdict(
                pair.job, job, limits, pair.checker_pid, pair.cgroups
            )
            duration_ms = int((time.monotonic() - started) * 1000)
            if verdict is not None and not verdict.get("lost"):
                # It answered throughout and flushed its output before every answer: what it
                # wrote is in the pipes now; `_release` kills it in the background.
                for output in outputs:
                    output.take_the_rest()
                return Observed(verdict, False, duration_ms, None, "", stdout, stderr, True)
            own_end: Exit | None = None
            if verdict is not None and verdict.get("lost") == "exited":  # did it end by itself?
                with contextlib.suppress(TimeoutError):
                    own_end = await launcher.exited(pair.run_id, launcher.exit_grace_s)
            launcher.kill(pair.run_id)
            if self._checker is not None:
                self._checker.kill(pair.run_id)
            if cgroups is not None:
                cgroups.kill_all()
            try:
                ended = own_end or await launcher.exited(pair.run_id, launcher.kill_grace_s)
                await asyncio.wait_for(
                    asyncio.gather(*(asyncio.shield(o.closed) for o in outputs)),
                    launcher.kill_grace_s,
                )
            except TimeoutError as exc:
                raise SandboxInfraError("the candidate did not die after SIGKILL") from exc
        finally:
            for output in outputs:
                output.close()
        return Observed(
            verdict,
            deadline != "",
            duration_ms,
            ended,
            cgroups.memory_event() if cgroups is not None else "",
            stdout,
            stderr,
            killed=own_end is None,
            sigkill_is_foreign=launcher.sigkill_is_foreign,
            process_limit=cgroups is not None and cgroups.process_limit_reached(),
            starved=deadline == "starved",
        )

    async def _release(self, pair: Pair) -> None:
        if pair.released:
            return
        pair.released = True
        pair.job.close()
        for fd in (pair.stdout, pair.stderr):
            with contextlib.suppress(OSError):
                os.close(fd)
        await self._abandon(pair.run_id, pair.slot, pair.cgroups)

    async def _abandon(self, run_id: int, slot: int, cgroups: Cgroups | None) -> None:
        """Kill what a run left and free its uid slot once its processes are gone (a slot
        whose cgroups still hold a process after the kill grace is never handed out again)."""
        servers: list[CandidateLauncher | ForkServer] = [self.launcher]
        if self._checker is not None:
            servers.append(self._checker)
        for server in servers:
            server.kill(run_id)
        for server in servers:
            with contextlib.suppress(TimeoutError, KeyError):
                await server.exited(run_id, server.kill_grace_s)
            server.forget(run_id)
        gone = True
        if cgroups is not None:
            gone = await cgroups.reap()
        if gone:
            _TAKEN_SLOTS.discard(slot)

    def _take_warm(self, tmpfs_mb: int) -> Pair | None:
        """A warm pair whose processes are both still alive, if any."""
        pool, checker = self._pool.get(tmpfs_mb, []), self._started()
        while pool:
            pair = pool.pop()
            servers = (self.launcher, checker) if checker else ()
            if servers and not any(server.has_exited(pair.run_id) for server in servers):
                return pair
            self._spawn(self._release(pair))
        return None

    def _refill(self, tmpfs_mb: int) -> None:
        missing = self.warm - len(self._pool.get(tmpfs_mb, [])) - self._filling.get(tmpfs_mb, 0)
        for _ in range(max(missing, 0)):
            self._filling[tmpfs_mb] = self._filling.get(tmpfs_mb, 0) + 1
            self._spawn(self._fill_one(tmpfs_mb), filling=True)

    async def _fill_one(self, tmpfs_mb: int) -> None:
        try:
            pair = await self._prepare(tmpfs_mb)
        except SandboxInfraError:
            return  # the next run that needs a pair reports the fault
        finally:
            self._filling[tmpfs_mb] -= 1
        self._pool.setdefault(tmpfs_mb, []).append(pair)

    def _spawn(self, work: Coroutine[object, object, None], filling: bool = False) -> None:
        """Run `work` in the background: a fill (cancelled by `close`) or a release (awaited)."""
        task = asyncio.get_running_loop().create_task(work)
        tasks = self._fills if filling else self._tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _stop(self) -> None:
        """Stop the checker zygote and the launcher (which kill whatever they started)."""
        await asyncio.gather(
            *([self._checker.close()] if self._checker else []), self.launcher.close()
        )
        self._checker = None

    async def close(self) -> None:
        """Stop filling the pool, let released runs finish dying, destroy the warm pairs, and
        stop the checker zygote and the launcher."""
        for task in list(self._fills):
            task.cancel()
        await asyncio.gather(*self._fills, *self._tasks, return_exceptions=True)
        idle = [pair for pool in self._pool.values() for pair in pool]
        self._pool.clear()
        await asyncio.gather(*(self._release(pair) for pair in idle), return_exceptions=True)
        await self._stop()
