"""The checker process: holds the tests and the verdict, and calls the program only as data.

`main(job_fd, calls_fd, replies_fd)` runs in a child of the checker zygote (`zygote.py`): its
own uid, no network, read-only file system, not dumpable, and no code of the model anywhere in
its memory (the Kubernetes pod's launcher forks it the same way, `pod_launcher.py`). It reads
the job from the host on `job_fd` (a codec frame: program, tests, units, helpers, entry point,
its deadline, how long the candidate may take to come up, the candidate's rlimits), then:

1. waits for the candidate's ("ready",) (up to `start_timeout_s`: a sandbox that never comes
   up is a platform fault), tells the host ("started",) on `job_fd`, starts its own clock
   (`deadline_s`), and sends the candidate ("load", program, rlimits);
2. builds the test namespace: a proxy for each callable the program defines (`checker_calls.
   Proxy`: a call of it is a call of the program's, over the pipes), the program's small
   plain-data globals, then the task's helpers (code from the task's prompt, trusted) run
   *here*, so `poly`, `encode_cyclic` or `check` always mean the task's own. A builtin's name
   is the program's only where the task names it as under test (`Run.namespace`);
3. runs every test unit (`judge.split_tests`), `check(<entry point>)`, then the hidden units,
   and writes one verdict frame to `job_fd`: {status, tests_passed, tests_total, error,
   exc_type, lost}. A hidden unit (`TaskSpec.hidden_tests`) counts like any other, but its
   failure reads only "a hidden test failed (<exception type>)": no source line (compiled as
   `HIDDEN_FILE`, which `describe` never shows), message or traceback, so no feedback holds
   its expected value.

`lost` is "" when the candidate answered throughout, else why it stopped (`checker_calls.
LOST_REASONS`). The host decides the final status from the verdict, its own unit count, and the
candidate's exit status and cgroup events.

Not covered: tests that pass callables or other non-data objects to the program (such a call
fails its test unit: `CallRefused`) or look at the arguments after a call (mutations stay in the
candidate); hiding hidden units' inputs (the program may print its arguments) or their count.
"""

from __future__ import annotations

import builtins
import os
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from infra.sandbox import codec
from infra.sandbox.checker_calls import (
    CallRefused,
    CandidateFault,
    CandidateLost,
    Channel,
    Proxy,
    program_exception,
)

SEVERITY = {"passed": 0, "failed": 1, "error": 2, "memory_exceeded": 3}
REPORT_CHARS = 8000
"""Tracebacks of failing units kept in the verdict (the first ones)."""
HIDDEN_FILE = "hidden_tests.py"  # where hidden units are compiled: never a key of `Run.files`
CHECKER_ADDRESS_SPACE = 4 << 30
"""RLIMIT_AS of a checker: decoded replies are capped by `codec`, so this only stops runaways."""


def describe(exc: BaseException, files: dict[str, str]) -> str:
    """Traceback text of `exc` over the tests' and helpers' lines, then the program's own."""
    lines, tb = [], exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename in files:
            lines.append(f'  File "{code.co_filename}", line {tb.tb_lineno}, in {code.co_name}')
            source = files[code.co_filename].splitlines()
            if 0 < tb.tb_lineno <= len(source):
                lines.append("    " + source[tb.tb_lineno - 1].strip())
        tb = tb.tb_next
    lines += getattr(exc, "program_traceback", [])
    # The program chose these fields: an unhashable filename, a line number too long to print.
    if isinstance(exc, SyntaxError) and type(exc.filename) is str and exc.filename in files:
        lines.append(f'  File "{exc.filename}", line {printable(exc.lineno)}')
    if lines:
        lines.insert(0, "Traceback (most recent call last):")
    message = printable(exc)
    lines.append(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)
    return "\n".join(lines) + "\n"


def printable(value: object, limit: int = REPORT_CHARS) -> str:
    """`str(value)` for a report, whatever the program made it: an int past the int-to-str
    digit limit, or a `__str__` that fails, must not end the checker without a verdict."""
    try:
        text = str(value)
    except Exception:  # noqa: BLE001 - ValueError (digits), OverflowError, a broken __str__
        if type(value) is int:
            return f"<an int of {value.bit_length()} bits>"
        return "<unprintable>"
    return text[:limit]


def classify(exc: BaseException) -> str:
    """The verdict's status for a unit's failure. "memory_exceeded" only says a MemoryError
    ended it, which the program may have raised itself: the host decides whether its memory
    limit was hit (`judge.MEMORY_ACCOUNTED`)."""
    if isinstance(exc, MemoryError):
        return "memory_exceeded"
    if isinstance(exc, CallRefused):  # a test the checker cannot run, as a TypeError was
        return "error"
    if isinstance(exc, AssertionError | SystemExit | CandidateFault):
        return "failed"
    return "error"


class Run:
    """One job's evaluation: the outcome so far, and the rules that make it a verdict."""

    def __init__(self, job: dict[str, Any], channel: Channel, job_fd: int) -> None:
        self.job, self.channel, self.job_fd = job, channel, job_fd
        tests, helpers = str(job.get("tests") or ""), str(job.get("helpers") or "")
        self.files = {"tests.py": tests, "helpers.py": helpers}
        self.units = [  # (is a test, hidden, its source at its line of the tests)
            (bool(u["test"]), bool(u.get("hidden")), "\n" * (int(u["line"]) - 1) + str(u["source"]))
            for u in job.get("units") or []
        ]
        self.entry_point = str(job["entry_point"]) if job.get("entry_point") else None
        self.under_test = frozenset(
            str(name) for name in [self.entry_point, *(job.get("under_test") or [])] if name
        )
        """The names the task says the tests call as the program's functions: its entry point,
        and the job's "under_test" (the functions kind's: what the task's own modules define),
        which no host sends yet."""
        self.total = bool(self.entry_point) + sum(unit[0] for unit in self.units)
        self.passed, self.worst, self.error, self.exc_type = 0, "passed", "", ""

    def verdict(self, status: str | None = None, lost: str = "") -> dict[str, object]:
        status = status or self.worst
        if status == "passed" and (self.passed != self.total or lost):
            status = "failed"
        return {
            "status": status,
            "tests_passed": self.passed,
            "tests_total": self.total,
            "error": self.error[:REPORT_CHARS],
            "exc_type": self.exc_type,
            "lost": lost,
        }

    def record(self, exc: BaseException, status: str | None = None, hidden: bool = False) -> str:
        """Note a failure (its traceback; a hidden unit's type only); the worst names the status."""
        status = status or classify(exc)
        if len(self.error) < REPORT_CHARS:
            shown = f"a hidden test failed ({type(exc).__name__})\n" if hidden else None
            self.error += shown or describe(exc, self.files)
        if SEVERITY[status] > SEVERITY[self.worst]:
            self.worst, self.exc_type = status, type(exc).__name__
        return status

    def load(self) -> dict[str, object] | None:
        """Load the program in the candidate; its exports, or None (the verdict is decided)."""
        channel = self.channel
        try:
            ready = channel.receive()
        except CandidateLost as lost:
            raise CandidateLost("not_ready", str(lost)) from None
        if ready != ("ready",):
            raise CandidateLost("not_ready", "the first message was not ready")
        channel.deadline = time.monotonic() + float(self.job["deadline_s"])
        codec.write_all(self.job_fd, codec.frame(("started",)))
        channel.send(("load", self.job["program"], self.job.get("rlimits") or {}))
        reply = channel.receive()
        if reply[0] == "loaded" and len(reply) == 2 and type(reply[1]) is dict:
            return reply[1]
        if reply[0] == "raised" and len(reply) == 2:
            exc = program_exception(reply[1], {})
            if isinstance(exc, CandidateLost):
                raise exc
            status = self.record(exc)
            self.worst = "error" if status == "failed" else status
        elif reply[0] == "exited" and len(reply) == 2:
            code = reply[1]
            if self.units or self.entry_point or code not in (None, 0):
                exited = f"the program exited (SystemExit: {printable(code, 200)})"
                self.record(CandidateFault(exited), "failed")
        else:
            raise CandidateLost("protocol", "an unexpected reply to load")
        return None

    def namespace(self, exports: dict[str, object]) -> dict[str, object]:
        """The tests' globals: the program's exports, except dunder names (`__builtins__` would
        replace the tests' builtins) and builtins' names, so a program's `abs = lambda x: 0` or
        `def isinstance(*a)` never reaches a test that uses them as tools. The names under test
        (`under_test`: the entry point) are the program's even where a builtin has the name,
        and even where the program does not define them (a call then fails as the program's):
        else a task's `sum` or `round` was the builtin in every test calling it by name, which
        passed a wrong or empty program and failed an honest one.

        That opens no forge: the task, never the program, names them, and a test's call of such
        a name is a call of the function under test (as in HumanEval's one module, where the
        program's `def round` shadows the builtin too), so what the program answers there is
        what the asserts judge. With an entry point named `isinstance`, a test's `isinstance(x,
        int)` is the program's answer being checked, not a check the program can make lie; a
        task that also meant the builtin by that name cannot have both, in one module or here.
        Every other builtin name stays the builtin, whatever the program defines: what the
        program defines never makes a name under test, since in the functions kind the agent
        writes the modules, and its `abs = lambda x: 0` would be "defined by a module under
        test" as much as its `filter`; only the task's own tree can say which names its tests
        are about (the job's "under_test"). Until a host sends them, a module's `filter` stays
        the builtin in such a check's asserts (tests/infra/sandbox/test_builtin_named.py)."""
        namespace: dict[str, object] = {"__name__": "__main__", "__builtins__": builtins}
        for name, export in exports.items():
            if type(name) is not str or not name.isidentifier() or name.startswith("__"):
                continue
            if hasattr(builtins, name) and name not in self.under_test:
                continue
            if export is None:
                namespace[name] = Proxy(self.channel, name)
            elif type(export) is tuple and len(export) == 1:
                namespace[name] = export[0]
        for name in self.under_test:
            if name.isidentifier() and not name.startswith("__") and name not in namespace:
                namespace[name] = Proxy(self.channel, name)
        self.channel.namespace = namespace
        return namespace

    def evaluate(self) -> dict[str, object]:
        """The verdict; CandidateLost propagates to `main`."""
        exports = self.load()
        if exports is None:
            return self.verdict()
        if not self.units and not self.entry_point:
            return self.verdict("passed")
        namespace, hidden = self.namespace(exports), False
        try:
            if self.files["helpers.py"]:
                exec(compile(self.files["helpers.py"], "helpers.py", "exec"), namespace)  # noqa: S102 - the task's own code
            steps: list[tuple[bool, bool, Callable[[], object]]] = []
            for is_test, hidden, source in self.units:
                code = compile(source, HIDDEN_FILE if hidden else "tests.py", "exec")
                steps.append((is_test, hidden, partial(exec, code, namespace)))
        except Exception as exc:  # noqa: BLE001 - the task's code is broken: no test can run
            status = self.record(exc, hidden=hidden)
            return self.verdict("error" if status == "failed" else status)
        if self.entry_point:
            steps.append((True, False, partial(self.check, namespace, exports)))
        steps.sort(key=lambda step: step[1])  # stable: the shown units, `check`, the hidden ones
        for is_test, hidden, action in steps:
            if not self.run_unit(action, is_test, hidden):
                return self.verdict("error" if self.worst == "failed" else self.worst)
        return self.verdict()

    def check(self, namespace: dict[str, object], exports: dict[str, object]) -> None:
        """The tests' `check(<entry point>)`, with the program's entry point."""
        name, check = str(self.entry_point), namespace.get("check")
        if name not in exports or exports[name] is not None:
            raise NameError(f"the program does not define {name}()")
        if not callable(check):
            raise NameError("the tests do not define check(candidate)")
        check(Proxy(self.channel, name))

    def run_unit(self, action: Callable[[], object], is_test: bool, hidden: bool = False) -> bool:
        """Run one unit; False when a setup unit failed (the remaining units cannot run)."""
        faults = self.channel.faults
        try:
            action()
        except CandidateLost:
            raise
        except BaseException as exc:  # noqa: BLE001 - every failure of a unit is a result
            if self.channel.lost is not None:  # the test caught it: the run still ends here
                raise self.channel.lost from None
            self.record(exc, hidden=hidden)
            return is_test
        if self.channel.lost is not None:
            raise self.channel.lost
        if self.channel.faults != faults:  # a CandidateFault the test caught still fails it
            fault = CandidateFault("a call in this test did not end with plain data")
            self.record(fault, hidden=hidden)
            return is_test
        self.passed += is_test
        return True


def main(job_fd: int, calls_fd: int, replies_fd: int) -> None:
    """Read the job, evaluate it against the candidate, write the verdict, exit."""
    job: dict[str, Any] = codec.read_frame(job_fd)
    if type(job) is not dict:
        os._exit(2)
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (CHECKER_ADDRESS_SPACE, CHECKER_ADDRESS_SPACE))
    start_deadline = time.monotonic() + float(job["start_timeout_s"])
    run = Run(job, Channel(calls_fd, replies_fd, start_deadline), job_fd)
    try:
        verdict = run.evaluate()
    except CandidateLost as lost:
        verdict = run.verdict("failed", lost.reason)
        verdict["error"] = verdict["error"] or str(lost)
    except MemoryError:
        verdict = run.verdict("memory_exceeded")
    codec.write_all(job_fd, codec.frame(verdict))
