"""The candidate process: runs the model's program and answers the checker's calls with data.

`serve(calls_fd, replies_fd)` runs in a sandboxed child of the candidate zygote (see
`zygote.py`) after its namespaces, uid and seccomp filter are in place, or as the only process
of a gVisor container or of a Kubernetes pod's candidate (`zygote.py serve`). It speaks frames
of `codec.py`:

    → ("ready",)                                        once, before any job exists
    ← ("load", program, rlimits)
    → ("loaded", {name: None | (value,)})               callables: None; plain data: (value,)
    | ("raised", error) | ("exited", code)               the program's top level failed / exited
    ← ("call", name, args, kwargs)  (any number)
    → ("return", value) | ("raised", error) | ("invalid", reason)

where `error` is (type name, builtin base name, args or None, message, traceback lines). The
program runs in this process and may rewrite everything here, even the loop below: nothing in
this file is trusted. What it sends is only ever plain data that the checker decodes into fresh
objects, so the worst a program can do is answer like some other program could have.

Not covered: objects that are not plain data (class instances, generators, callbacks) cannot
cross in either direction, and argument mutations are not sent back to the checker.
"""

from __future__ import annotations

import builtins
import sys
from collections.abc import Callable
from typing import Any

from infra.sandbox import codec

PROGRAM_FILE = "program.py"
EXPORT_BYTES = 1 << 16
"""Plain-data globals larger than this (encoded) are not exported to the tests."""


def _error(exc: BaseException, source: str) -> tuple[str, str, object, str, list[str]]:
    """`exc` as data: its type name, nearest builtin base, args, message, program lines."""
    cls = type(exc)
    base = next(
        (c.__name__ for c in cls.__mro__ if getattr(builtins, c.__name__, None) is c), "Exception"
    )
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001 - a program exception whose __str__ fails
        message = "<unprintable>"
    try:
        args: object = exc.args
        codec.encode(args, max_bytes=EXPORT_BYTES)
    except BaseException:  # noqa: BLE001 - args that are not plain data travel as the message
        args = None
    lines, tb, code_lines = [], exc.__traceback__, source.splitlines()
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename == PROGRAM_FILE:
            lines.append(f'  File "{PROGRAM_FILE}", line {tb.tb_lineno}, in {code.co_name}')
            if 0 < tb.tb_lineno <= len(code_lines):
                lines.append("    " + code_lines[tb.tb_lineno - 1].strip())
        tb = tb.tb_next
    if isinstance(exc, SyntaxError) and exc.filename == PROGRAM_FILE:
        lines.append(f'  File "{PROGRAM_FILE}", line {exc.lineno}')
    return cls.__name__, base, args, message[:4000], lines[-40:]


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:  # noqa: SIM105 - a broken stream must not stop the reply
            stream.flush()
        except BaseException:  # noqa: BLE001, S110
            pass


def _exports(namespace: dict[str, object]) -> dict[str, object]:
    """The program's top-level names the tests may use: callables, and small plain data."""
    exports: dict[str, object] = {}
    for name, value in list(namespace.items()):
        if name.startswith("__") or type(name) is not str:
            continue
        if callable(value):
            exports[name] = None
            continue
        try:
            codec.encode(value, max_bytes=EXPORT_BYTES)
        except (codec.NotPlainData, RecursionError):
            continue
        exports[name] = (value,)
    return exports


def _set_rlimits(rlimits: dict[str, tuple[int, int]]) -> None:
    import resource

    for name, (soft, hard) in rlimits.items():
        resource.setrlimit(getattr(resource, name), (soft, hard))


def _load(program: str) -> tuple[object, dict[str, object] | None]:
    """Run the program as `__main__`; the reply to "load" and its namespace (None if it failed)."""
    module = type(sys)("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    sys.argv = [PROGRAM_FILE]
    namespace = module.__dict__
    try:
        exec(compile(program, PROGRAM_FILE, "exec"), namespace)  # noqa: S102 - the program, sandboxed
    except SystemExit as exc:
        code = exc.code if type(exc.code) in (int, str, type(None)) else str(exc.code)
        return ("exited", code), None
    except BaseException as exc:  # noqa: BLE001 - everything the program raises is a result
        return ("raised", _error(exc, program)), None
    return ("loaded", _exports(namespace)), namespace


def _reply(namespace: dict[str, Any], message: Any, program: str) -> bytes:
    """The framed reply to one "call" message."""
    name = "?"
    try:
        kind, name, args, kwargs = message
        function = namespace.get(name) if kind == "call" else None
        if not callable(function):
            raise NameError(f"name {name!r} is not defined by the program")
        value = function(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - everything the program raises is a result
        return codec.frame(("raised", _error(exc, program)))
    try:
        body = codec.encode(value, what=f"the value {name}() returned")
    except codec.NotPlainData as exc:
        return codec.frame(("invalid", str(exc)))
    except RecursionError:
        return codec.frame(("invalid", f"the value {name}() returned is nested too deeply"))
    return codec.frame_encoded(codec.join_tuple(codec.encode("return"), body))


def serve(calls_fd: int, replies_fd: int, lock_rlimits: Callable[[], None] | None = None) -> None:
    """Announce readiness, load the program, then answer calls until the channel closes. With
    `lock_rlimits` (the local backend's), the program may not change the limits set here."""
    write, read = codec.write_all, codec.FrameReader(calls_fd).read
    write(replies_fd, codec.frame(("ready",)))
    kind, program, rlimits = read()
    if kind != "load":
        return
    _set_rlimits(rlimits)
    if lock_rlimits is not None:
        try:
            lock_rlimits()
        except OSError as exc:  # unlocked, the limits still hold: only lowering them is open
            sys.stderr.write(f"sandbox: resource limits not locked: {exc}\n")
    reply, namespace = _load(program)
    _flush()
    write(replies_fd, codec.frame(reply))
    while namespace is not None:
        try:
            message = read()
        except codec.CodecError:
            return
        answer = _reply(namespace, message, program)
        _flush()
        write(replies_fd, answer)
