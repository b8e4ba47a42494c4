"""The checker process: holds the tests and the verdict, and calls the program only as data.

`main(job_fd, calls_fd, replies_fd)` runs in a child of the checker zygote (`zygote.py`): its
own uid, no network, read-only file system, not dumpable, and no code of the model anywhere in
its memory (the Kubernetes pod's launcher forks it the same way, `pod_launcher.py`). It reads
the job from the host on `job_fd` (a codec frame: program, tests, units, helpers, entry point,
its deadline, how long the candidate may take to come up, the candidate's rlimits), then:

1. waits for the candidate's ("ready",) (up to `start_timeout_s`: a sandbox that never comes
   up is a platform fault), tells the host ("started",) on `job_fd`, starts its own clock
   (`deadline_s`), and sends the candidate ("load", program, rlimits);
2. builds the test namespace: a proxy for each callable the program defines (calling it sends
   ("call", name, args, kwargs) and returns the decoded reply, a fresh object of this process,
   or raises the builtin exception of the reported name), the program's small plain-data
   globals, then the task's helpers (code from the task's prompt, trusted) run *here*, so
   `poly`, `encode_cyclic` or `check` always mean the task's own;
3. runs every test unit (`judge.split_tests`), `check(<entry point>)`, then the hidden units,
   and writes one verdict frame to `job_fd`: {status, tests_passed, tests_total, error,
   exc_type, lost}. A hidden unit (`TaskSpec.hidden_tests`) counts like any other, but its
   failure reads only "a hidden test failed (<exception type>)": no source line (compiled as
   `HIDDEN_FILE`, which `describe` never shows), message or traceback, so no feedback holds
   its expected value.

`lost` is "" when the candidate answered throughout, else why it stopped: "not_ready" (its
sandbox never came up: a platform fault), "exited" (end of file: the program exited or was
killed), "timeout" (no answer before the deadline) or "protocol" (bytes that are not a frame of
plain data). The host decides the final status from the verdict, its own unit count, and the
candidate's exit status and cgroup events.

Not covered: tests that pass callables or other non-data objects to the program (such a call
fails its test unit: `CallRefused`) or look at the arguments after a call (mutations stay in the
candidate); hiding hidden units' inputs (the program may print its arguments) or their count.
"""

from __future__ import annotations

import builtins
import os
import select
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from infra.sandbox import codec

SEVERITY = {"passed": 0, "failed": 1, "error": 2, "memory_exceeded": 3}
LOST_REASONS = ("not_ready", "exited", "timeout", "protocol")
REPORT_CHARS = 8000
"""Tracebacks of failing units kept in the verdict (the first ones)."""
HIDDEN_FILE = "hidden_tests.py"  # where hidden units are compiled: never a key of `Run.files`
CHECKER_ADDRESS_SPACE = 4 << 30
"""RLIMIT_AS of a checker: decoded replies are capped by `codec`, so this only stops runaways."""


class CandidateLost(BaseException):  # noqa: N818 - a BaseException, and sticky (Channel.lost)
    """The candidate stopped answering; the whole run ends with `reason` (see LOST_REASONS),
    whatever a test does with the exception."""

    def __init__(self, reason: str, detail: str = "") -> None:
        detail = f": {detail}" if detail else ""
        super().__init__(f"the program stopped answering ({reason}){detail}")
        self.reason = reason


class CandidateFault(BaseException):  # noqa: N818 - a BaseException, and counted (faults)
    """A call's reply cannot stand for a value: not plain data, or SystemExit and the like.
    It fails the test unit it happened in, even if the test catches it."""


class CallRefused(CandidateFault):
    """A test's arguments are not plain data: the checker's refusal, so no `except TypeError`
    of a test may take it for the program's exception (a BaseException, counted in faults)."""


class ProgramError(Exception):
    """The program raised an exception that has no builtin or task-defined class of its name."""


class Channel:
    """The checker's end of the call pipes, with the run's deadline on every read and write."""

    def __init__(self, calls_fd: int, replies_fd: int, deadline: float) -> None:
        self.calls_fd, self.replies_fd, self.deadline = calls_fd, replies_fd, deadline
        self.faults = 0
        self.lost: CandidateLost | None = None
        """Set for good when the candidate stops answering, even if a test catches it."""
        self.reader = codec.FrameReader(replies_fd)
        self._readable, self._writable = select.poll(), select.poll()
        self._readable.register(replies_fd, select.POLLIN)
        self._writable.register(calls_fd, select.POLLOUT)
        self.namespace: dict[str, object] = {}
        """Where task-defined exception classes are looked up (the test namespace)."""
        os.set_blocking(calls_fd, False)

    def _wait(self, poller: select.poll) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            raise CandidateLost("timeout")

    def send(self, message: object) -> None:
        self._write(codec.frame(message))

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            self._wait(self._writable)
            try:
                view = view[os.write(self.calls_fd, view) :]
            except BlockingIOError:
                continue
            except OSError as exc:  # EPIPE: the candidate is gone
                raise CandidateLost("exited", str(exc)) from None

    def receive(self) -> tuple[object, ...]:
        try:
            message = self.reader.read(partial(self._wait, self._readable))
        except codec.EndOfFile:
            raise CandidateLost("exited") from None
        except codec.CodecError as exc:
            raise CandidateLost("protocol", str(exc)) from None
        if type(message) is not tuple or not message or type(message[0]) is not str:
            raise CandidateLost("protocol", "a reply that is not a tagged tuple")
        return message

    def call(self, name: str, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        """The program's `name(*args, **kwargs)`, as a fresh value or exception of this process.
        Once the candidate is lost, every call (and the unit, see `Run.run_unit`) ends so."""
        if self.lost is not None:
            raise self.lost
        try:
            return self._call(name, args, kwargs)
        except CandidateLost as lost:
            self.lost = lost
            raise

    def _call(self, name: str, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        try:
            request = codec.frame(("call", name, args, kwargs))
        except codec.NotPlainData as exc:
            self.faults += 1
            raise CallRefused(f"{name}() can only be called with plain data here: {exc}") from None
        self._write(request)
        reply = self.receive()
        if reply[0] == "return" and len(reply) == 2:
            return reply[1]
        if reply[0] == "raised" and len(reply) == 2:
            raised = program_exception(reply[1], self.namespace)
            self.faults += isinstance(raised, CandidateFault)
            raise raised
        if reply[0] == "invalid" and len(reply) == 2:
            self.faults += 1
            raise CandidateFault(f"{name}(): {reply[1]}")
        raise CandidateLost("protocol", f"unexpected reply {str(reply[0])[:40]!r}")


class Proxy:
    """Stands for one of the program's functions in the tests: calls it through the channel."""

    def __init__(self, channel: Channel, name: str) -> None:
        self._channel, self.__name__, self.__qualname__ = channel, name, name

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._channel.call(self.__name__, args, kwargs)

    def __repr__(self) -> str:
        return f"<function {self.__name__} of the program>"


def program_exception(error: Any, namespace: dict[str, object]) -> BaseException:
    """A fresh exception of this process for the candidate's `error` data: the task-defined or
    builtin class of that name, else its nearest builtin base, else ProgramError."""
    try:
        name, base, args, message, lines = error
        name, base, message = str(name), str(base), str(message)
        lines = [str(line) for line in lines]
    except (TypeError, ValueError):
        return CandidateLost("protocol", "a malformed exception")
    if name in ("SystemExit", "KeyboardInterrupt", "GeneratorExit"):
        exc: BaseException = CandidateFault(f"the program raised {name} ({message})")
    else:
        cls = _exception_class(name, namespace) or _exception_class(base, namespace)
        exc = ProgramError(f"{name}: {message}" if message else name)
        if cls is not None:
            try:
                exc = cls(*args) if type(args) is tuple else cls(message)
            except Exception:  # noqa: BLE001 - a class whose constructor wants other arguments
                exc = ProgramError(f"{name}: {message}")
        # As PEP 479, a StopIteration must not end a test's loop (`all(map(candidate, ...))`),
        # judged by the class raised here, not by the reported base: a program's own `class
        # StopIteration(Exception)` has the base "Exception", but its name is the builtin's.
        if isinstance(exc, StopIteration | StopAsyncIteration):
            exc = RuntimeError(f"the program raised {name}")
    exc.program_traceback = lines  # type: ignore[attr-defined]
    return exc


def _exception_class(name: str, namespace: dict[str, object]) -> type[Exception] | None:
    cls = namespace.get(name, getattr(builtins, name, None))
    if isinstance(cls, type) and issubclass(cls, Exception):
        return cls
    return None


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
        namespace: dict[str, object] = {"__name__": "__main__", "__builtins__": builtins}
        for name, export in exports.items():
            if type(name) is not str or not name.isidentifier() or hasattr(builtins, name):
                continue
            if name.startswith("__"):  # `__builtins__` would replace the tests' builtins
                continue
            if export is None:
                namespace[name] = Proxy(self.channel, name)
            elif type(export) is tuple and len(export) == 1:
                namespace[name] = export[0]
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
