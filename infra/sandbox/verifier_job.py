"""A verifier run's job, as the host hands it to the checker and waits for the verdict.

    job = checker_job(program, tests, helpers, units, entry_point, limits, rlimits, bound)
    verdict, stopped = await await_verdict(pair.job, job, limits, pair.checker_pid, pair.cgroups)

`checker_job` is what a checker is sent for one run (plain data only, see `checker.py`): the
local and gVisor verifier's (`verifier.py`) and a Kubernetes pod's (`kubernetes.py`).
`await_verdict` sends it over the checker's job socket and keeps the run's deadline: the
checker says when the candidate is up ("started"), and the program has had its time once it
used `timeout_s` of the wall clock, not counting time its answering process or the checker
spent runnable but waiting for a CPU (`judge.deadline_state`); a host that never gave it that
time within `judge.starvation_bound` makes the run a platform fault ("starved").

Not covered: starting, killing and reaping the pair, and judging what it left (`verifier.py`,
`judge.py`); the Kubernetes pod's own wait for its checker (`pod_launcher.py`).
"""

from __future__ import annotations

import asyncio
import socket
import time

from contracts.task import SandboxLimits
from infra.sandbox import codec
from infra.sandbox.cgroups import Cgroups
from infra.sandbox.channels import JobSocket
from infra.sandbox.judge import deadline_state
from infra.sandbox.scheduling import run_delay

VERDICT_GRACE_S = 1.0
"""How long past the candidate's start deadline the host waits for the checker to say so."""
DEADLINE_POLL_S = 0.1
"""How often the host looks again, past the deadline, whether the program had its time."""
START_TIMEOUT_S = 30.0
"""How long a candidate may take to come up before that is a platform fault."""


def checker_job(
    program: str,
    tests: str,
    helpers: str,
    units: list[dict[str, object]],
    entry_point: str | None,
    limits: SandboxLimits,
    rlimits: dict[str, tuple[int, int]],
    deadline_s: float | None = None,
) -> dict[str, object]:
    """What a checker is sent for one run (see checker.py): plain data only; `units`
    (`judge.split_tests`) carry the hidden tests' too, marked "hidden". `deadline_s`: the
    checker's own deadline once the candidate is up (default the run's timeout; the verifier
    gives it the starvation bound, as the host decides when the program had its time)."""
    return {
        "program": program,
        "tests": tests,
        "helpers": helpers,
        "units": units,
        "entry_point": entry_point,
        "deadline_s": limits.timeout_s if deadline_s is None else deadline_s,
        "start_timeout_s": START_TIMEOUT_S,
        "rlimits": rlimits,
    }


async def await_verdict(
    job_socket: socket.socket,
    job: dict[str, object],
    limits: SandboxLimits,
    checker_pid: int | None,
    cgroups: Cgroups | None,
) -> tuple[dict[str, object] | None, str]:
    """Send the job on the checker's `job_socket`; the checker's verdict (None if it died
    without one), and "" or why the host stopped waiting first: "timeout" (the program had its
    deadline's worth of time) or "starved" (the host never gave it that time:
    `judge.deadline_state`). `checker_pid`: the checker on this host (its waits for a CPU are
    not the program's); `cgroups`: the candidate's (its waits, `Cgroups.cpu_wait`)."""
    frames = JobSocket(job_socket)
    try:
        await frames.send(job)
        first = await asyncio.wait_for(frames.next(), START_TIMEOUT_S + VERDICT_GRACE_S)
        if first != ("started",):  # the candidate never came up: the checker said why
            return (first if type(first) is dict else None), ""
        started, reading = time.monotonic(), asyncio.ensure_future(frames.next())
        checker_before = run_delay(checker_pid)
        try:
            done, _ = await asyncio.wait({reading}, timeout=limits.timeout_s)
            while not done:
                cpu_wait = cgroups.cpu_wait() if cgroups is not None else None
                checker = max(run_delay(checker_pid) - checker_before, 0.0)
                state = deadline_state(time.monotonic() - started, cpu_wait, limits, checker)
                if state != "running":
                    return None, state
                done, _ = await asyncio.wait({reading}, timeout=DEADLINE_POLL_S)
            verdict = reading.result()
        finally:
            reading.cancel()
    except (TimeoutError, OSError, codec.CodecError):
        return None, ""  # no verdict, and not the program's deadline: the checker failed
    return (verdict if type(verdict) is dict else None), ""
