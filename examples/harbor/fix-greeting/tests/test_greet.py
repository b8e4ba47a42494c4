"""Scores /app/greet.py: 1 when greet("Ada") is "Hello, Ada!" and greet("") "Hello, world!".

greet.py is the agent's code: it runs in this sandbox under this uid, so what it prints, the
status it exits with, or a process it leaves behind could claim the reward (`os._exit(0)` at
import passed a test that trusted the exit status; a child writing 1 to the reward after the
test wrote 0 passed too). So this scorer:
- makes itself non-dumpable before any of that code runs: no process of its uid may then ptrace
  it or reach its memory and descriptors through /proc;
- runs each call in a fresh python3 and compares what it printed here;
- whatever happened, SIGKILLs every other process of the sandbox but its own ancestors (the
  sandbox's shells) and waits until no thread of them runs (a process whose main thread alone
  ended reads as a zombie while its other threads run: each thread is asked), then writes the
  reward to a new file renamed over reward.txt (a descriptor that code opened on reward.txt
  writes to the file replaced).
The code may still kill this process, or make it fail (it cannot chmod /logs/verifier, which is
root's, but it may spoil reward.txt), after writing a reward of its own: a reward counts only from
a test that exits 0 (infra/environments/checks.py), so such a test scores 0.
"""

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time

CASES = {"Ada": "Hello, Ada!", "": "Hello, world!"}
CALL = (
    "import sys; sys.path.insert(0, '/app'); from greet import greet; "
    "print(repr(greet(sys.argv[1])))"
)
LOGS = "/logs/verifier"
PR_SET_DUMPABLE = 4


def passes(name: str, expected: str) -> bool:
    """Whether greet(name), called in a process of its own, printed repr(expected) within 10 s."""
    call = subprocess.Popen([sys.executable, "-c", CALL, name], cwd="/app", stdout=subprocess.PIPE)
    assert call.stdout is not None
    with call.stdout:
        try:
            call.wait(timeout=10)
        except subprocess.TimeoutExpired:
            call.kill()
            return False
        os.set_blocking(call.stdout.fileno(), False)  # a process it left may hold the pipe open
        try:
            printed = os.read(call.stdout.fileno(), 4096)
        except BlockingIOError:
            printed = b""
    return printed == f"{expected!r}\n".encode()


def ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 0:
        pids.add(pid)
        with open(f"/proc/{pid}/stat") as stat:
            pid = int(stat.read().rpartition(")")[2].split()[1])
    return pids


def runs(pid: int) -> bool:
    """Whether a thread of process `pid` still runs (is neither a zombie nor dead). Each thread
    is asked, not the process: one whose main thread alone ended (SYS_exit, not exit_group)
    reads Z in /proc/<pid>/stat while its other threads run on (one kept writing the reward)."""
    for tid in os.listdir(f"/proc/{pid}/task"):
        # OSError: that thread gone meanwhile
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{tid}/stat") as stat:
            if stat.read().rpartition(")")[2].split()[0] not in ("Z", "X"):
                return True
    return False


def others_gone(spared: set[int], within_s: float = 5.0) -> bool:
    """SIGKILL every process but `spared` until no thread of one runs; whether that happened
    within `within_s`. A SIGKILL sent to a process ends all its threads, its main thread a
    zombie or not; a process forks no more once killed: each round leaves fewer."""
    end = time.monotonic() + within_s
    while time.monotonic() < end:
        running = []
        for pid in (int(entry) for entry in os.listdir("/proc") if entry.isdigit()):
            if pid in spared:
                continue
            try:
                alive = runs(pid)
            except (FileNotFoundError, ProcessLookupError):  # gone meanwhile
                continue
            except OSError:  # cannot be looked at: counted as running, never skipped
                alive = True
            if alive:
                running.append(pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):  # still running
                    os.kill(pid, signal.SIGKILL)
        if not running:
            return True
        time.sleep(0.01)
    return False


def main() -> None:
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0)")
    reward = 0
    try:
        reward = int(all(passes(name, expected) for name, expected in CASES.items()))
    finally:
        reward = reward if others_gone(ancestors()) else 0
        with contextlib.suppress(FileNotFoundError):  # whatever that code left there
            os.unlink(f"{LOGS}/reward.txt")
        fd, written = tempfile.mkstemp(dir=LOGS)
        with os.fdopen(fd, "w") as out:
            out.write(f"{reward}\n")
        os.replace(written, f"{LOGS}/reward.txt")


if __name__ == "__main__":
    main()
