"""PID 1 of every Kubernetes sandbox pod: runs the harness and prints one result line to the log.

The Kubernetes backend starts the container as `python3 -S -I -c <this file's source>` with
these environment variables: TEMPERED_HARNESS (the source of `infra/sandbox/harness.py`),
TEMPERED_JOB_0..N (the harness job exactly as `infra.sandbox.process.HarnessJob.payload` makes
it, host nonce included, split to keep each value under Linux's 128 KiB limit), TEMPERED_RUN (`{"timeout_s", "output_bytes"}`) and
TEMPERED_RESULT_NONCE. It never runs inside the worker and imports nothing of Tempered (the
sandbox image is a plain Python image); it is the in-pod half of `process.run_harness`.

What it does, in order:
1. Pops the variables and makes itself non-dumpable (prctl), so the untrusted child, which
   runs as the same uid, can read neither /proc/1/environ (tests, nonces) nor /proc/1/fd (the
   pod log).
2. Runs the harness in a new session with the job on stdin and the verdict pipe at the
   `verdict_fd` it writes into the job; stdout/stderr are read through pipes and capped.
3. Kills the whole session at the wall-clock deadline; detects cgroup OOM kills through
   /sys/fs/cgroup/memory.events.
4. Prints `{"tempered_result": <nonce>, ...}` (exit code, captures, the raw verdict stream) as
   the last line of its stdout. The backend reads it with the pod-log API, ignores every line
   without the result nonce, and judges the verdict stream with the host's harness nonce.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

MEMORY_EVENTS = "/sys/fs/cgroup/memory.events"
VERDICT_CAP = 1 << 20
"""Bytes of the verdict stream kept (as `process.VERDICT_CAP`)."""
DRAIN_AFTER_EXIT_S = 0.5
"""How long to keep reading pipes once the harness has exited (a child may still hold them)."""


def _oom_kills() -> int:
    try:
        with open(MEMORY_EVENTS) as events:
            for line in events:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _make_undumpable() -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 4
    except (OSError, AttributeError):
        pass


def _run(harness: str, job: dict[str, object], timeout_s: float, cap: int) -> dict[str, object]:
    verdict_read, verdict_write = os.pipe()
    job = dict(job, verdict_fd=verdict_write)
    oom_before, started = _oom_kills(), time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-S", "-I", "-c", harness],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=(verdict_write,),
        start_new_session=True,
        cwd=os.environ.get("HOME", "/"),
        env={
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": os.environ.get("HOME", "/"),
            "TMPDIR": os.environ.get("TMPDIR", "/tmp"),
            "PYTHONDONTWRITEBYTECODE": "1",
        },
    )
    os.close(verdict_write)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    payload, stdin = json.dumps(job).encode(), proc.stdin

    def feed() -> None:
        try:
            stdin.write(payload)
            stdin.close()
        except OSError:
            pass

    threading.Thread(target=feed, daemon=True).start()
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    buffers = {out: bytearray(), err: bytearray(), verdict_read: bytearray()}
    caps = {out: cap, err: cap, verdict_read: VERDICT_CAP}
    truncated = {out: False, err: False, verdict_read: False}
    open_fds = set(buffers)
    timed_out = False
    deadline, exited_at = started + timeout_s, None
    while open_fds:
        now = time.monotonic()
        if now >= deadline:
            timed_out = proc.poll() is None
            break
        if exited_at is None and proc.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > DRAIN_AFTER_EXIT_S:
            break
        ready, _, _ = select.select(list(open_fds), [], [], min(deadline - now, 0.1))
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                open_fds.discard(fd)
                continue
            room = caps[fd] - len(buffers[fd])
            truncated[fd] = truncated[fd] or len(chunk) > room
            buffers[fd] += chunk[: max(room, 0)]
    with contextlib.suppress(OSError):  # the session may already be gone
        os.killpg(proc.pid, signal.SIGKILL)
    exit_code = proc.wait()
    return {
        "exit_code": exit_code,
        "duration_ms": int((time.monotonic() - started) * 1000),
        "timed_out": timed_out,
        "oom_killed": _oom_kills() > oom_before,
        "stdout": bytes(buffers[out]).decode("utf-8", "replace"),
        "stderr": bytes(buffers[err]).decode("utf-8", "replace"),
        "stdout_truncated": truncated[out],
        "stderr_truncated": truncated[err],
        "verdict_stream": bytes(buffers[verdict_read]).decode("utf-8", "replace"),
    }


def main() -> None:
    harness = os.environ.pop("TEMPERED_HARNESS")
    chunks = sorted(
        (int(k.rpartition("_")[2]), k) for k in os.environ if k.startswith("TEMPERED_JOB_")
    )
    job = json.loads("".join(os.environ.pop(k) for _, k in chunks))
    run = json.loads(os.environ.pop("TEMPERED_RUN"))
    nonce = os.environ.pop("TEMPERED_RESULT_NONCE")
    _make_undumpable()
    result = _run(harness, job, float(run["timeout_s"]), int(run["output_bytes"]))
    sys.stdout.write("\n" + json.dumps({"tempered_result": nonce, **result}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
