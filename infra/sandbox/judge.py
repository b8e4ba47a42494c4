"""How the host counts test units and turns what it saw of one run into an `ExecutionResult`.

    units = split_tests(tests, entry_point, hidden_tests)  # the host's own count of test units
    result = judge(observed, expected_units, limits, backend="local", enforcement="cgroup")

`observed` is the checker's verdict (or None), whether the host's deadline passed, and how the
candidate ended (`Exit`: wait status, CPU time, a platform fault its launcher saw), the run's
memory events, and whether the host killed it. The rules, in their one home:

- `passed` only when the checker's verdict says so *and* its counts equal the host's own count
  of test units, which is > 0 whenever there are tests;
- the candidate stopped answering ("lost"), each rule only where none before it holds: an OOM
  kill in the run at its own memory limit → memory_exceeded; its launcher saw the platform end
  it (a zygote or gVisor sandbox died, a gVisor sandbox out of host tasks: its program is held
  to its limit inside) → a platform fault; an OOM kill without the run's limit being hit (a
  global OOM kill) → a platform fault; SIGXCPU, or SIGKILL after using its CPU limit →
  timeout; SIGKILL with the limit reached where the kernel counts no OOM kills ("reached") →
  memory_exceeded; SIGKILL otherwise → a platform fault only where the program cannot SIGKILL
  itself (`sigkill_is_foreign`: the local candidate is pid 1 of its own pid namespace, and its
  seccomp filter refuses ptrace and a SIGKILL sent as the kernel's, `confine.py`), else the
  program's own end; a broken protocol → failed; a clean exit of a run without tests →
  passed; its process limit reached → failed; anything else → failed (an early exit, a closed
  channel, a wait status that is no end). A limit reached is a high-water mark of the whole
  run, no cause of its end: a program that once met its process cap (a thread refused,
  caught) or touched most of its memory and freed it, then exited 0 or spun to its CPU limit,
  ended by that exit or that limit (gVisor, whose kernel holds both caps inside, says so too);
- the deadline passed: timeout once the program had its deadline's worth of time
  (`deadline_state`: time it or the checker spent waiting for a CPU they never got does not
  count, unless the program gave its CPU away itself: a nice, SCHED_IDLE, fewer CPUs); the
  host starved it (the worker's own overload) → a platform fault. A Harbor check's script is
  held to the same rule (`workspace_deadline.py`);
- no verdict: past the deadline → timeout, else the checker died → a platform fault; a
  candidate whose sandbox never came up → a platform fault;
- a verdict of memory_exceeded (a MemoryError reached the checker) needs the host's evidence
  where it has some (`MEMORY_ACCOUNTED`): without an OOM kill at its cgroup's limit it is the
  program's `error` (`raise MemoryError('fake')` is no memory limit hit). Where an
  address-space cap is the limit (rlimit-only, gVisor, Kubernetes), the allocator's MemoryError
  cannot be told from a raised one, and both are memory_exceeded.

Hidden tests (`TaskSpec.hidden_tests`) are test units like the others here: counted by the
host, so `passed` needs every one of them; only the checker's report of them differs (it names
the exception type, nothing else: `checker.py`). They must hold a top-level assert and no
uncalled `check` (`contracts.task_tests.hidden_tests_problem`; `split_tests` refuses others): a hidden
`def check(candidate)` alone was one unit that only defined `check`, and passed every program.

Platform faults raise `SandboxInfraError` (retried, never a reward). Pure functions; tested
with fabricated observations in tests/infra/sandbox/test_judge.py.
"""

from __future__ import annotations

import ast
import os
import signal
from dataclasses import dataclass
from typing import Any, Literal

from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import SandboxLimits
from contracts.task_tests import hidden_tests_problem, parsed
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.process import Capture

STARVATION_FACTOR, STARVATION_SLACK_S = 3.0, 20.0
"""A program gets `timeout_s + max(3 * timeout_s, 20 s)` of wall time to have had `timeout_s`:
its run is a platform fault only when the host gave it (all its processes together) less than
about a tenth of a CPU for that long (sessions share a CPU fairly under autogroup scheduling)."""
MEMORY_ACCOUNTED = frozenset({("local", "cgroup")})
"""(backend, enforcement) whose runs' memory a cgroup bounds, the host reading its accounting.
There the program's own memory never ends in a MemoryError (the kernel OOM-kills it, and
`Cgroups.memory_event` says "limit"): one only comes from an allocation past the generous
address-space cap (`launcher.candidate_space_mb`), refused before it used any memory, or from
the program's own `raise`, so without that evidence it is the program's error. Not gVisor's:
its cgroup holds gVisor's kernel too, and its address-space cap is the program's limit."""
MemoryEvent = Literal["", "limit", "global", "reached"]
"""What the run's memory accounting saw (`Cgroups.memory_event`): no OOM kill; an OOM kill of one
of its processes at its own limit ("limit"); an OOM kill while its own limit was never hit (the
host ran out of memory: "global"); or, where the kernel counts no OOM kills, its limit reached
at some point ("reached": an OOM kill only if the program died of SIGKILL)."""


def split_tests(tests: str, entry_point: str | None, hidden: str = "") -> list[dict[str, object]]:
    """Test units: each top-level `assert` is one test, other statements are setup.

    Tests without a top-level assert run as one unit, which is itself the one test unless an
    entry point is given (then `check(entry_point)` is the test). `hidden` (the task's
    `hidden_tests`) is split the same way after them, each of its units marked "hidden" (the
    checker runs them after `check` and never shows why they failed); ValueError when it breaks
    `hidden_tests_problem`'s rule (no top-level assert, or a `check` nothing calls), which would
    pass every program. Split here, on the host, so the count the verdict must match is the
    host's own.
    """
    if problem := hidden_tests_problem(hidden):
        raise ValueError(f"hidden tests: {problem}")
    units = _split(tests, entry_point is None)
    return units + [{**unit, "hidden": True} for unit in _split(hidden, True)]


def _split(tests: str, whole_is_test: bool) -> list[dict[str, object]]:
    if not tests:
        return []
    tree = parsed(tests)
    if tree is None:
        return [{"test": whole_is_test, "line": 1, "source": tests}]
    if not any(isinstance(stmt, ast.Assert) for stmt in tree.body):
        return [{"test": whole_is_test, "line": 1, "source": tests}]
    lines = tests.splitlines(keepends=True)
    units: list[dict[str, object]] = []
    for stmt in tree.body:
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
        source = "".join(lines[first - 1 : stmt.end_lineno])
        units.append({"test": isinstance(stmt, ast.Assert), "line": first, "source": source})
    return units


def expected_units(units: list[dict[str, object]], entry_point: str | None) -> int:
    """How many test units a run of `units` (and `check(entry_point)`) must report passed."""
    return (1 if entry_point else 0) + sum(bool(unit["test"]) for unit in units)


@dataclass(frozen=True)
class Exit:
    """How the candidate ended, as its launcher saw it."""

    status: int
    """A wait status (`os.waitstatus_to_exitcode` reads it; one it cannot is the program's)."""
    cpu_s: float = 0.0
    """CPU seconds it used (gVisor: its sandbox's since the run's start, gVisor's kernel's
    included, as the program has no process of its own on the host; 0 where unknown)."""
    fault: str = ""
    """Set when the platform ended it (its zygote or gVisor sandbox died): a platform fault."""


@dataclass
class Observed:
    """What the host learned of one run, before it is judged."""

    verdict: dict[str, Any] | None
    timed_out: bool
    duration_ms: int
    exit: Exit | None
    memory: MemoryEvent
    stdout: Capture
    stderr: Capture
    killed: bool
    """The host killed the candidate (so its exit status is the host's doing, not its own)."""
    sigkill_is_foreign: bool = True
    """Whether a SIGKILL can only come from outside the candidate's sandbox."""
    process_limit: bool = False
    """The run's processes reached their limit (a sandbox may die of it: gVisor's Sentry)."""
    starved: bool = False
    """The host stopped waiting because it never gave the program its time (`deadline_state`)."""


def judge(
    seen: Observed, expected: int, limits: SandboxLimits, backend: str, enforcement: str
) -> ExecutionResult:
    """The run's result from the checker's verdict, the host's own count of test units
    (`expected`) and how the candidate ended. Raises SandboxInfraError for platform faults."""
    verdict = seen.verdict
    if verdict is None and not seen.timed_out:
        raise SandboxInfraError("the checker ended without a verdict")
    verdict = verdict or {"lost": "timeout"}
    lost = str(verdict.get("lost") or "")
    exit_code: int | None = 0
    passed, total = int(verdict.get("tests_passed") or 0), int(verdict.get("tests_total") or 0)
    error, detail = str(verdict.get("error") or ""), str(verdict.get("exc_type") or "")
    if lost == "not_ready":
        stderr = seen.stderr.text()[-2000:] or seen.stdout.text()[-2000:]
        raise SandboxInfraError(f"the candidate sandbox did not start: {stderr}")
    if lost == "timeout":
        if seen.starved:
            raise starvation_fault(limits)
        status, detail = ExecStatus.TIMEOUT, f"wall-clock deadline of {limits.timeout_s}s"
        exit_code = None
    elif lost:
        status, detail, exit_code = _ended_early(seen, lost, expected, limits)
    else:
        status = ExecStatus(str(verdict.get("status")))
        if status == ExecStatus.MEMORY_EXCEEDED and seen.memory != "limit":
            status = unproven_memory(backend, enforcement)
        if status == ExecStatus.PASSED and not passed == total == expected:
            status = ExecStatus.FAILED
            detail = f"the verdict counts {passed}/{total}, the host {expected}"
    stderr, error, detail = seen.stderr.text(), utf8(error), utf8(detail)
    if error and error not in stderr:
        stderr = (stderr + error)[-limits.output_bytes :]
    return ExecutionResult(
        status=status,
        exit_code=exit_code,
        duration_ms=seen.duration_ms,
        stdout=seen.stdout.text(),
        stderr=stderr,
        truncated=seen.stdout.truncated or seen.stderr.truncated,
        tests_passed=passed,
        tests_total=max(total, expected),
        backend=backend,
        limits=limits,
        enforcement=enforcement,
        detail=detail,
    )


def unproven_memory(backend: str, enforcement: str) -> ExecStatus:
    """The status of a MemoryError that reached the checker while the run's memory accounting
    never saw its limit reached: the program's error where that accounting bounds its memory
    (`MEMORY_ACCOUNTED`), else memory_exceeded (an address-space cap is the limit, and its
    MemoryError and a raised one look the same from here)."""
    if (backend, enforcement) in MEMORY_ACCOUNTED:
        return ExecStatus.ERROR
    return ExecStatus.MEMORY_EXCEEDED


def utf8(text: str) -> str:
    """`text` as valid UTF-8: the checker's report quotes the program's exception messages,
    which may hold lone surrogates (`ValueError(chr(0xD800))`) that no JSON encoder takes (the
    result's `model_dump_json` would fail, and the whole group with it)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def starvation_bound(timeout_s: float) -> float:
    """The wall time within which a program must have had its deadline's worth of time."""
    return timeout_s + max(STARVATION_FACTOR * timeout_s, STARVATION_SLACK_S)


def starvation_fault(limits: SandboxLimits) -> SandboxInfraError:
    """The platform fault of a run the host starved (`deadline_state` said "starved"): the
    verifier's, and a Harbor check script's (`workspace_deadline.py`, the same rule)."""
    bound = starvation_bound(limits.timeout_s)
    return SandboxInfraError(
        f"the host starved the program: in {bound:.0f}s it did not get the "
        f"{limits.timeout_s}s of time its deadline gives it (it waited for a CPU)"
    )


def deadline_state(
    elapsed_s: float,
    cpu_wait: tuple[float, float] | None,
    limits: SandboxLimits,
    checker_wait_s: float = 0.0,
) -> Literal["running", "timeout", "starved"]:
    """Whether a program still answering after `elapsed_s` of wall time had its time.

    Its time is what it used of the wall clock: not the time its answering process spent
    runnable but waiting for a CPU, nor the time the checker did (`checker_wait_s`: while the
    checker runs the tests the program sleeps on its pipe, so a starved checker leaves no wait
    of the program's), unless its processes together burnt that much CPU (then it starved
    itself). `cpu_wait` is (that wait, the run's CPU seconds) (`Cgroups.cpu_wait`; None:
    unknown, or the program gave its CPU away itself, so the wall clock counts); its CPU must
    include that of processes that exited (cpuacct counts them), or children nobody reaps could
    hold the CPU and leave no trace. "timeout" once it had `limits.timeout_s`; "starved" when
    `starvation_bound` passed first (the worker's own overload: a platform fault)."""
    if cpu_wait is None:
        used = elapsed_s
    else:
        used = max(elapsed_s - cpu_wait[0] - checker_wait_s, cpu_wait[1])
    if used >= limits.timeout_s:
        return "timeout"
    return "starved" if elapsed_s >= starvation_bound(limits.timeout_s) else "running"


def _ended_early(
    seen: Observed, lost: str, expected: int, limits: SandboxLimits
) -> tuple[ExecStatus, str, int | None]:
    """(status, detail, exit code) of a candidate that stopped answering before the verdict:
    it exited, was killed, or broke the protocol."""
    if seen.memory == "limit":
        return ExecStatus.MEMORY_EXCEEDED, "killed by the memory limit", None
    if seen.exit is not None and seen.exit.fault:  # before the process limit: a gVisor
        raise SandboxInfraError(seen.exit.fault)  # sandbox's limit is reached by gVisor's tasks
    if seen.memory == "global":
        raise SandboxInfraError("an OOM kill outside the run's own memory limit (host memory)")
    code = None
    if not seen.killed and seen.exit is not None:
        code = _exit_code(seen.exit.status)  # its own end, not the host's kill
    cpu_s = seen.exit.cpu_s if seen.exit is not None else 0.0
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and cpu_s >= limits.cpu_s):
        return ExecStatus.TIMEOUT, f"CPU limit of {limits.cpu_s}s", code
    if code == -signal.SIGKILL and seen.memory == "reached":  # the OOM killer's, uncounted
        return ExecStatus.MEMORY_EXCEEDED, "killed by the memory limit", None
    if code == -signal.SIGKILL and seen.sigkill_is_foreign:
        raise SandboxInfraError("the candidate was killed from outside its sandbox")
    if lost == "protocol":
        return ExecStatus.FAILED, "the program broke the call protocol", code
    if expected == 0 and code == 0:
        return ExecStatus.PASSED, "", code
    if seen.process_limit:  # a high-water mark: the end's cause only when nothing else is
        return ExecStatus.FAILED, f"reached its limit of {limits.max_processes} processes", None
    return ExecStatus.FAILED, "the program exited before its tests reported", code


def _exit_code(status: int) -> int | None:
    """The exit code of a wait status (minus the signal that killed it); None for a status
    that is no end (a stop or continue that a tracer's wait reports): the program brought it
    about (it made its launcher its tracer), so it reads as its failure, never a fault."""
    try:
        return os.waitstatus_to_exitcode(status)
    except ValueError:
        return None
