"""The program run *inside* every sandbox: runs untrusted code, then its tests, and reports.

Backends start it as `python3 -S -I /harness.pyc` (harness_file.py, compiled once by the
sandbox's interpreter; or `-c <source>`) with the job on stdin as one dict
`{program, tests, units, entry_point, nonce, rlimits, verdict_fd}`, marshalled (or JSON, slower: json's imports cost as much as Python's own start-up) and a
verdict pipe on `verdict_fd` (3 by default): a `{"ready": True}` line once the job is read, then
one verdict line, a Python dict literal. It never runs as a module of the worker.

Why a reward cannot be faked (the program runs first, in this same interpreter):
- The verdict is a line on the verdict fd carrying a random per-run nonce that arrives on stdin
  and lives only in `main`'s frame, on the main thread. The program and its tests run on a
  second thread, so no frame the program can reach (the stdlib needs frame introspection, so
  it stays allowed) leads to the nonce; the outcome comes back through a closure cell the
  program can read but not rebind. The host ignores lines without the nonce, and `passed` is
  only signed after every test unit ran and returned normally.
- An audit hook (which user code cannot remove) refuses the remaining ways across: other
  threads' frames (`sys._current_frames`), gc traversal, tracing/profiling (which can rewrite a
  frame's locals), new audit hooks, ctypes, and opening /proc/*/mem.
- `os._exit`, `sys.exit`, `SystemExit` in `check`, killed harness, fork-and-exit: no verdict line
  (or a `failed` one), so the host reports `failed`. Printing success markers does nothing:
  stdout is not a verdict channel. The tests are a string held by the harness, never a file.
- Tests run in their own namespace: a copy of the program's names minus any that shadow a
  builtin, with a private pristine builtins dict; modules the program patched are restored and
  modules it imported are dropped first. So `builtins.abs = ...`, `AssertionError = ...`,
  `def check(...)`, `math.isclose = ...` at the program's top level cannot change what the tests
  see. Residual, by HumanEval's same-namespace contract: the *candidate*, while being tested,
  can patch shared modules or inspect its caller's frame, and objects that lie in `__eq__` fool
  a plain `==`; these fool a weak test, they cannot forge a verdict.

Test units: every top-level `assert` of `tests` is one unit (each runs, a failing one does not
stop the next), plus `check(<entry_point>)` when an entry point is given; tests with neither are
one unit run as a whole. The verdict is `passed` only when every unit passed.
"""

from __future__ import annotations

import marshal
import os
import sys

if False:  # typing only: importing `typing` or `types` costs start-up time
    import types
    from collections.abc import Mapping
    from typing import Any

VERDICT_FD = 3
"""Default file descriptor of the verdict pipe inside the sandbox (the job may name another)."""


_BLOCKED_EVENTS = frozenset(
    {
        "sys._current_frames",  # the one way from the program's thread to the main thread's frame
        "sys.settrace",  # trace functions can rewrite a running frame's locals
        "sys.setprofile",
        "sys.addaudithook",
        "gc.get_objects",
        "gc.get_referrers",
        "gc.get_referents",
        "ctypes.dlopen",
        "ctypes.dlsym",
        "ctypes.cdata",
    }
)
_BLOCKED_MODULES = frozenset({"ctypes", "_ctypes", "_testcapi", "_testinternalcapi"})


def _install_guard() -> None:
    """Install the audit hook. It only touches names bound here, so patching builtins or this
    module cannot bend it; ValueError is what the stdlib expects from refused introspection."""
    blocked, blocked_modules = _BLOCKED_EVENTS, _BLOCKED_MODULES
    realpath, str_type, bytes_type = os.path.realpath, str, bytes

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event in blocked:
            raise ValueError(f"sandbox: {event} is disabled")
        if event == "import" and args and args[0] in blocked_modules:
            raise ImportError(f"sandbox: module {args[0]} is disabled")
        if event == "open" and args:
            path = args[0]
            if type(path) is bytes_type:
                path = path.decode("utf-8", "replace")
            if type(path) is str_type:
                resolved = realpath(path)
                if resolved.startswith("/proc/") and resolved.endswith(("/mem", "/self", "/task")):
                    raise PermissionError(f"sandbox: opening {path} is disabled")

    sys.addaudithook(hook)


def _describe(exc: BaseException, files: dict[str, str]) -> str:
    """Traceback text of `exc`, limited to the program's and the tests' own lines."""
    lines = ["Traceback (most recent call last):"]
    entries, tb = [], exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        entries.append((code.co_filename, tb.tb_lineno, code.co_name))
        tb = tb.tb_next
    for name, lineno, function in entries:
        if name in files:
            lines.append(f'  File "{name}", line {lineno}, in {function}')
            source = files[name].splitlines()
            if 0 < lineno <= len(source):
                lines.append("    " + source[lineno - 1].strip())
    if isinstance(exc, SyntaxError) and exc.filename in files:
        lines.append(f'  File "{exc.filename}", line {exc.lineno}')
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001 - a user exception whose __str__ fails
        message = "<unprintable>"
    lines.append(f"{type(exc).__name__}: {message}" if message else type(exc).__name__)
    return "\n".join(lines) + "\n"


def _read_job() -> dict[str, object]:
    chunks = []
    while True:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    raw = b"".join(chunks)
    if raw[:2] == b'{"':  # JSON; a marshalled dict starts with '{' and a type code
        import json

        job: dict[str, object] = json.loads(raw)
    else:
        job = marshal.loads(raw)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    import resource

    for name, (soft, hard) in dict(job.get("rlimits") or {}).items():  # type: ignore[call-overload]
        resource.setrlimit(getattr(resource, name), (soft, hard))
    return job


def _compile_units(units: list[dict[str, Any]]) -> list[tuple[bool, types.CodeType]]:
    """(is_test, code) per unit; the host split `tests` (see `process.split_tests`).

    Each unit is compiled at its own line of tests.py, so tracebacks point at the real line.
    """
    return [
        (
            bool(u["test"]),
            compile("\n" * (int(u["line"]) - 1) + str(u["source"]), "tests.py", "exec"),
        )
        for u in units
    ]


def _restore_modules(saved: Mapping[str, tuple[object, dict[str, object]]]) -> None:
    """Undo the program's patches to modules that existed before it, and forget its imports.

    `sys` keeps its state (streams, path); `builtins` and `__main__` are restored by the caller.
    """
    modules, module_type = sys.modules, type(sys)
    for name in [n for n in modules if n not in saved]:
        del modules[name]
    for name, (module, namespace) in saved.items():
        modules[name] = module  # type: ignore[assignment]
        if type(module) is module_type and name not in ("sys", "builtins", "__main__"):
            current = module.__dict__
            current.clear()
            current.update(namespace)


SEVERITY = {"passed": 0, "failed": 1, "error": 2, "memory_exceeded": 3}


def main() -> None:
    """Read the job, run it on another thread, and sign that thread's outcome with the nonce.

    The nonce lives only in this frame, on the main thread. The program and its tests run on
    a second thread, whose frames (which the stdlib needs to inspect) lead nowhere near it; the
    outcome comes back through a closure cell the program can read but not rebind.
    """
    job = _read_job()
    write, render, exit_now, str_type, int_type = os.write, repr, os._exit, str, int
    verdict_fd = int(job.get("verdict_fd") or VERDICT_FD)  # type: ignore[call-overload]
    write(verdict_fd, b'{"ready": True}\n')
    nonce = str(job.pop("nonce"))
    import _thread

    done = _thread.allocate_lock()
    done.acquire()
    outcome: object = None

    def runner() -> None:
        nonlocal outcome
        try:
            outcome = _evaluate(job)
        finally:
            done.release()

    _install_guard()
    try:  # noqa: SIM105 - no contextlib in the harness (start-up time)
        _thread.stack_size(32 << 20)  # room for deep recursion, as on a main thread
    except (ValueError, MemoryError):
        pass
    try:
        _thread.start_new_thread(runner, ())
        done.acquire()
    except BaseException:  # noqa: BLE001 - e.g. interrupt_main(): no verdict, never a pass
        exit_now(0)
    result = outcome
    if not (type(result) is tuple and len(result) == 5):
        exit_now(0)
    status, passed, total, error, exc_type = result  # type: ignore[misc]
    if not (
        type(status) is str_type
        and type(passed) is int_type
        and type(total) is int_type
        and type(error) is str_type
        and type(exc_type) is str_type
        and status in SEVERITY
    ):
        exit_now(0)
    if status == "passed" and passed != total:
        status = "failed"
    line = render(
        {
            "nonce": nonce,
            "status": status,
            "tests_passed": passed,
            "tests_total": total,
            "error": error[-4000:],
            "exc_type": exc_type,
        }
    )
    write(verdict_fd, ("\n" + line + "\n").encode())
    exit_now(0)


Outcome = tuple[str, int, int, str, str]


def _evaluate(job: dict[str, object]) -> Outcome:  # noqa: C901 - one linear story
    """Run the program, then each test unit: (status, passed, total, error, exc_type)."""
    program, tests = str(job["program"]), str(job.get("tests") or "")
    entry_point = str(job["entry_point"]) if job.get("entry_point") else None
    files = {"program.py": program, "tests.py": tests}
    run, compile_, describe, severity, plain = exec, compile, _describe, SEVERITY, "".join
    is_instance, is_callable, restore_modules = isinstance, callable, _restore_modules
    stdout, stderr = sys.stdout, sys.stderr
    try:
        units = _compile_units(job.get("units") or [])  # type: ignore[arg-type]
        program_code = compile_(program, "program.py", "exec")
    except SyntaxError as exc:
        units, program_code, syntax_error = [], None, exc
    total = (1 if entry_point else 0) + len([1 for is_test, _ in units if is_test])
    import builtins

    builtins_dict, main_dict = vars(builtins), vars(sys.modules["__main__"])
    builtins_saved, main_saved = dict(builtins_dict), dict(main_dict)
    modules_saved = {n: (m, dict(vars(m))) for n, m in sys.modules.items() if m is not None}

    def restore_core() -> None:
        builtins_dict.clear()
        builtins_dict.update(builtins_saved)
        main_dict.clear()
        main_dict.update(main_saved)

    def finish(status: str, passed: int = 0, error: str = "", exc_type: str = "") -> Outcome:
        for stream in (stdout, stderr):
            try:  # noqa: SIM105 - no contextlib: fewer names the program could have patched
                stream.flush()
            except BaseException:  # noqa: BLE001, S110 - a broken stream must not hide the verdict
                pass
        return plain([status]), passed, total, plain([error]), plain([exc_type])

    def classify(exc: BaseException) -> tuple[str, str]:
        text = describe(exc, files)
        try:  # noqa: SIM105
            stderr.write(text)
        except BaseException:  # noqa: BLE001, S110
            pass
        if is_instance(exc, MemoryError):
            return "memory_exceeded", text
        if is_instance(exc, AssertionError | SystemExit):
            return "failed", text
        return "error", text

    if program_code is None:
        return finish("error", 0, classify(syntax_error)[1], "SyntaxError")
    namespace: dict[str, object] = {"__name__": "__main__", "__builtins__": builtins}
    try:
        run(program_code, namespace)
    except SystemExit as exc:
        restore_core()
        if tests or entry_point:
            return finish("failed", 0, classify(exc)[1], "SystemExit")
        return finish("passed" if exc.code in (None, 0) else "failed", 0, "", "SystemExit")
    except BaseException as exc:  # noqa: BLE001 - everything the program raises is a result
        restore_core()
        status, text = classify(exc)
        return finish("error" if status == "failed" else status, 0, text, type(exc).__name__)
    restore_core()
    if not tests and not entry_point:
        return finish("passed")
    restore_modules(modules_saved)

    private_builtins = dict(builtins_saved)
    test_ns = {k: v for k, v in namespace.items() if k not in private_builtins}
    test_ns.update(__name__="__main__", __builtins__=private_builtins)
    passed, worst, first_error, first_type = 0, "passed", "", ""
    for is_test, code in units:
        try:
            run(code, test_ns)
        except BaseException as exc:  # noqa: BLE001
            restore_core()
            status, text = classify(exc)
            if not is_test:  # setup broke: the remaining tests cannot run
                status = "error" if status == "failed" else status
                return finish(status, passed, text, type(exc).__name__)
            if severity[status] > severity[worst]:
                worst, first_error, first_type = status, first_error or text, type(exc).__name__
            continue
        restore_core()
        if is_test:
            passed += 1
    if entry_point:
        candidate, check = namespace.get(entry_point), test_ns.get("check")
        try:
            if candidate is None:
                raise NameError(f"the program does not define {entry_point!r}")
            if not is_callable(check):
                raise NameError("the tests do not define check(candidate)")
            check(candidate)
        except BaseException as exc:  # noqa: BLE001
            restore_core()
            status, text = classify(exc)
            if severity[status] > severity[worst]:
                worst, first_error, first_type = status, first_error or text, type(exc).__name__
        else:
            restore_core()
            passed += 1
    if passed == total and worst == "passed":
        return finish("passed", passed)
    return finish("failed" if worst == "passed" else worst, passed, first_error, first_type)


if __name__ == "__main__":
    main()
