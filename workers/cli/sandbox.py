"""`tempered sandbox run`: run one program (and its tests) in a sandbox and print the result.

    tempered sandbox run solution.py --tests tests.py --entry-point add --json
    tempered sandbox run solution.py --tests tests.py --helpers task_helpers.py
    tempered sandbox run solution.py --tests tests.py --hidden-tests hidden.py --entry-point add
    tempered sandbox run spin.py --backend gvisor --timeout 2 --memory-mb 128

The verdict comes from the verifier's checker process, which holds the tests (and the task's
helpers: trusted code run beside them, never the program's, and the hidden tests, which run
last, count, and fail as "a hidden test failed (<exception type>)" with nothing else shown); the
program runs in its own sandboxed process and is only called with plain data
(infra/sandbox/verifier.py).

Tests in HumanEval's form (`def check(candidate)`) need `--entry-point`: without it nothing
calls `check`, and any program passed them (`uncalled_check`), so they are refused. Hidden tests
are top-level asserts: only the shown tests' `check` is called, so hidden ones in that form (or
with no top-level assert) would pass any program, and are refused too (`hidden_tests_problem`,
the rule TaskSpec applies).

Exit status 0 whenever the sandbox worked, whatever the program did (read `status`); 2 for bad
input (a file that cannot be read, limits out of bounds, a `check` with no `--entry-point`, an
`--entry-point` with no `check` to pass it to, hidden tests without a top-level assert: one line
on stderr, nothing run); 3 when
the platform failed (`infra_error`, message on stderr). Runs the backend in this process, as the
sandbox activity does, without Temporal or S3.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import get_args

from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import SandboxLimits
from contracts.task_tests import defines_check, hidden_tests_problem, uncalled_check
from infra.sandbox import SandboxInfraError, get_backend
from infra.settings import SandboxBackendName, Settings
from workers.cli.errors import describe as describe_error
from workers.cli.errors import number

INFRA_ERROR_EXIT = 3


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sandbox = commands.add_parser("sandbox", help="run programs in the sandbox")
    actions = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="COMMAND")
    run = actions.add_parser("run", help="run PROGRAM.py (then its tests) in a sandbox")
    run.add_argument("program", type=Path, help="Python file to run")
    run.add_argument(
        "--tests", type=Path, help="Python file of tests that call the program's functions"
    )
    run.add_argument(
        "--helpers", type=Path, help="trusted task code the tests may use (run beside them)"
    )
    run.add_argument(
        "--hidden-tests",
        type=Path,
        help="Python file of top-level asserts that count but whose failures are never shown "
        "(run last)",
    )
    run.add_argument(
        "--entry-point",
        help="function passed to the tests' check(candidate) (needed when they or the helpers "
        "define one; refused when none does)",
    )
    run.add_argument("--backend", choices=get_args(SandboxBackendName), help="default: settings")
    run.add_argument("--timeout", type=number, help="wall-clock limit in seconds")
    run.add_argument("--memory-mb", type=int, help="memory limit in MiB")
    run.add_argument("--json", action="store_true", help="print one JSON object")
    run.set_defaults(func=run_cmd)


def run_cmd(args: argparse.Namespace, settings: Settings) -> int:
    overrides = {"timeout_s": args.timeout, "memory_mb": args.memory_mb}
    try:
        limits = SandboxLimits(**{k: v for k, v in overrides.items() if v is not None})
        program = read_source(args.program)
        tests = read_source(args.tests) if args.tests else ""
        helpers = read_source(args.helpers) if args.helpers else ""
        hidden_tests = read_source(args.hidden_tests) if args.hidden_tests else ""
    except ValueError as exc:  # pydantic's ValidationError too
        print(f"tempered sandbox: {describe_error(exc)}", file=sys.stderr)
        return 2
    if args.entry_point is None and uncalled_check(tests):
        print(
            f"tempered sandbox: {args.tests} defines check(candidate) and nothing calls it: name "
            "the program's function with --entry-point (without it any program passes)",
            file=sys.stderr,
        )
        return 2
    if args.entry_point is not None and not defines_check(tests, helpers):
        where = args.tests or "no --tests file"
        print(
            f"tempered sandbox: --entry-point {args.entry_point}: it is passed to the tests' "
            f"check(candidate), and {where} defines none; leave --entry-point out (top-level "
            "asserts call the program's functions themselves)",
            file=sys.stderr,
        )
        return 2
    if problem := hidden_tests_problem(hidden_tests):
        print(f"tempered sandbox: {args.hidden_tests}: {problem}", file=sys.stderr)
        return 2
    backend_name = args.backend or settings.sandbox.backend

    async def go() -> ExecutionResult:
        try:
            backend = get_backend(settings, backend_name)
        except Exception as exc:  # a backend that cannot even be set up (no runsc, no kubeconfig)
            raise SandboxInfraError(f"cannot set up the {backend_name} backend: {exc}") from exc
        try:
            return await backend.run(
                program, tests, limits, args.entry_point, helpers, hidden_tests
            )
        finally:
            await backend.close()

    try:
        result = asyncio.run(go())
    except SandboxInfraError as exc:
        print(f"tempered sandbox run: infra_error: {exc}", file=sys.stderr)
        if args.json:
            failed = ExecutionResult(
                status=ExecStatus.INFRA_ERROR, backend=backend_name, limits=limits, detail=str(exc)
            )
            print(failed.model_dump_json())
        return INFRA_ERROR_EXIT
    print(result.model_dump_json() if args.json else describe(result))
    return 0


def read_source(path: Path) -> str:
    """The text of a file given on the command line; ValueError naming it when it cannot be read
    (it was `[Errno 2] No such file or directory: 'x.py'`, exit 1)."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: a directory, not a Python file") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def describe(result: ExecutionResult) -> str:
    tests = f", tests {result.tests_passed}/{result.tests_total}" if result.tests_total else ""
    lines = [
        f"status: {result.status.value}{tests} ({result.backend}, {result.duration_ms} ms, "
        f"exit {result.exit_code}, limits by {result.enforcement})"
    ]
    if result.detail:
        lines.append(f"detail: {result.detail}")
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        if text:
            lines.append(f"--- {name} ---\n{text.rstrip()}")
    if result.truncated:
        lines.append("(output truncated)")
    return "\n".join(lines)
