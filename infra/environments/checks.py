"""Scoring a final workspace against hidden tests, in a verifier sandbox the agent never saw.

    graded = await check_functions(backend, workspace, contents, check, tests, limits)
    graded = await check_script(runner, scratch, spec, check, uid, limits, slot_name)

Two kinds (`tree.Check.kind`, carried by the hidden-tests tree):

- `functions` (the built-in `workspace` suite): the two-process verifier of the sandbox
  backend (`SandboxBackend.run`). The candidate process gets a program that writes the
  workspace's Python files (and data files, within a budget; links as what they name; never
  .git or caches: `functions_files.py`) into its private /tmp and star-imports the modules
  under test; the checker process holds the hidden tests (top-level asserts naming those
  modules' functions) and calls the functions as data. The score is the share of hidden
  asserts that passed (0 for Python files past the budget, or a program the backend cannot
  carry: `JobTooLarge`, Kubernetes's Job takes 1 MiB); its detail names what was not copied.
- `script` (Harbor tasks): /tests/test.sh run as Harbor runs it, as a program (`chmod +x`,
  then the script itself: the kernel runs its `#!` line's interpreter; `script_command`), in a
  fresh workspace sandbox, the final workspace at its workdir (a copy: the session is
  untouched; one holding a link into the verifier's own files, /tests or /logs/verifier, scores
  0 unchecked: `verifier_files.verifier_links`), the tests at /tests read-only, /logs/verifier
  writable; the score is the reward
  the script left there (reward.txt, else reward.json: `verifier_files.left_reward`), if it
  exited 0. The script runs with the workspace's code, as in Harbor, but in the base
  environment plus `[verifier] env` only: unlike Harbor's, never the Dockerfile's ENV (the
  workspace's files could forge the reward through it: `verifier_env`), within the task's
  memory (`WorkspaceSpec.limits_of`). Its deadline is the check's timeout (`check_limits`), by
  the functions kind's rule (`judge.deadline_state`): time the host kept it waiting for a CPU
  does not count, and a host that starved it is a platform fault (retried, never a score); it
  timed out once it had its time (0).

A task whose check cannot work (no check in the tests tree) raises `InvalidTask`, naming the
file; that is the task's fault, never retried and never a reward. A reward counts only from a
script that exits 0 (`EXIT_0_RULE`): one that exits non-zero, a signal included (bwrap reports
128 + its number), scores 0 and the reward it left is ignored, since the workspace's code runs
in it and can write a reward, then fail or kill the script, or keep the scorer from writing
over it. /logs/verifier is root's, mode 1777 (the code cannot chmod it), and pid 1 and a
script's shell are execute-only
shells (`Mounts.sealed`: no process may ptrace them or write their memory to exit 0): a script
whose `#!` names sh or bash (the file the sealed copy copies, or `/usr/bin/env sh|bash`), or
that has no `#!` line (Harbor's bash runs such a file), runs that copy, its argument kept
(`#!/bin/bash -e`). A script that leaves no reward file it can read (missing, a directory, a
link, a FIFO, past its size, not a finite number in [0, 1]: `verifier_files`), whatever its
exit status (`read_reward`), raises `BadReward`, an `InvalidTask` carrying that run's verdict
scored 0 (`graded`, its detail saying why): the script ran the workspace's code, which can spoil the file, so whose fault it
is depends on whose tree ran. The verify activity scores an agent's tree 0 and raises only when
the task's untouched tree does the same (activities/environment.py); `tempered tasks validate`
takes it as the task's (the trees it checks, the untouched one and the reference solution's,
are the task's own). A test script the hidden tests do not hold, or whose `#!` line no command
can name (longer than the kernel reads, a NUL, not UTF-8), is `InvalidTask` (`shebang`).

Not covered: a `script` check's verdict is only as strong as its test script. The workspace's
code runs inside the script's sandbox, under its uid, so code that writes a reward file itself
(or that runs on in the background and writes after the script did) forges the reward of a
script that exits 0 and does not guard against it (reward.txt is read first: a script that
writes reward.json must keep the code from writing reward.txt); examples/harbor/fix-greeting
shows a script that does (tests/test_greet.py). A script whose interpreter is not sh or bash
(`#!/usr/bin/env python3`, `env -S`, perl) runs the host's readable program, which is dumpable:
the code can write its memory (through /proc/<pid>/mem) to exit 0, unless the script makes
itself non-dumpable first (prctl PR_SET_DUMPABLE 0), as fix-greeting's scorer does; so are the
programs an sh or bash script runs (`python3 -c`, `timeout … bash`) unless each does the same. A
script that computes its expected answer from the workspace's files takes the agent's word for
it: the examples compare with copies in tests/. The workspace's code can also SIGSTOP the script
(only the script's own processes can: an agent's step leaves none behind, and the script's
sandbox is a pid namespace of its own): the run then gave its time away, the wall clock counts
from the stop, and the check times out at its deadline, scored 0, never the host's starvation
(`infra/sandbox/workspace_deadline.py`). The `functions` kind is the one whose verdict the
agent's code cannot reach.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import posixpath
import shlex
import shutil
import stat
import zlib
from collections.abc import Mapping
from pathlib import Path

from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import SandboxLimits, WorkspaceSpec
from infra.environments.base import Graded
from infra.environments.check_limits import check_limits as check_limits
from infra.environments.functions_files import MAX_PROGRAM_BYTES as MAX_PROGRAM_BYTES
from infra.environments.functions_files import program_files as program_files
from infra.environments.tree import Check, Manifest
from infra.environments.verifier_files import (
    LOGS_DIR,
    REWARD_FILE,
    REWARD_JSON,
    RewardError,
    left_reward,
    verifier_links,
)
from infra.sandbox.base import JobTooLarge, SandboxBackend
from infra.sandbox.sealed import SEALED_DIR, SHELLS
from infra.sandbox.workspace import BASE_ENV, CommandResult, CommandRunner, Mounts

TESTS_DIR = "/tests"
MAX_SHEBANG = 256
"""The bytes of a script the kernel reads for its `#!` line (BINPRM_BUF_SIZE)."""
EXIT_0_RULE = "a reward counts only from a script that exits 0"
"""The workspace's code runs in the script: it can write a reward of 1 and then make the script
fail or kill it (128 + the signal), or keep the scorer from writing over it (a chmod), so a
script that exits non-zero scores 0 whatever it left."""
FORGED_LINKS = "the final workspace holds links the verifier would follow into its own files"
"""Why a final workspace with such links is not verified (`verifier_files.verifier_links`):
`ln -s /tests/expected.txt primes.txt` passed a test that compared the two."""
VERIFIER_HOMES = (BASE_ENV["HOME"], "/dev/shm")
"""A script check's HOME: the first of these fresh tmpfs neither in its workspace nor above it
(no workspace may lie in /dev: `workspace.HIDDEN_PATHS`)."""


class InvalidTask(ValueError):
    """The task's own check is broken (not the agent's workspace)."""


class BadReward(InvalidTask):
    """A script check left no reward it could read: the task's fault when the tree it ran is the
    task's own, the agent's when its code ran in the script (`graded`: that run, scored 0;
    None from `read_reward`, which has no run to score)."""

    def __init__(self, message: str, graded: Graded | None = None) -> None:
        super().__init__(message)
        self.graded = graded


def verifier_env(workdir: str, check: Check) -> dict[str, str]:
    """What a script check adds to the sandbox's `BASE_ENV`: the task's `[verifier] env`, and
    unlike Harbor (whose verifier runs test.sh in the task's container, the image's ENV
    inherited) never the Dockerfile's ENV, which the agent's steps keep: through it the agent's
    files could forge the reward (`ENV PATH=/app/.venv/bin:$PATH` ran the workspace's planted
    programs, `ENV HOME=/app` its user site's `.pth`, `PYTHONPATH` into the workspace its
    modules, before the test's first line), so a test.sh that needs a variable sets it itself
    or in `[verifier] env`; a HOME outside the workspace at `workdir` (`VERIFIER_HOMES`: /tmp
    was the workspace under `WORKDIR /tmp`); no Python user site."""
    nested = [f"{home}/".startswith(f"{workdir}/") or f"{workdir}/".startswith(f"{home}/")
              for home in VERIFIER_HOMES]  # fmt: skip
    return {"HOME": VERIFIER_HOMES[nested.index(False)], "PYTHONNOUSERSITE": "1", **check.env}


def functions_program(files: Mapping[str, bytes], modules: list[str]) -> str:
    """A program that writes `files` under /tmp/workspace and imports `modules`' names."""
    packed = {path: base64.b64encode(data).decode() for path, data in files.items()}
    blob = base64.b64encode(zlib.compress(json.dumps(packed).encode())).decode()
    imports = "".join(f"from {module} import *  # noqa: F403\n" for module in modules)
    return (
        "def _materialize():\n"
        "    import base64, json, os, sys, zlib\n"
        "    root = '/tmp/workspace'\n"
        f"    files = json.loads(zlib.decompress(base64.b64decode({blob!r})))\n"
        "    for path, data in files.items():\n"
        "        target = os.path.join(root, path)\n"
        "        os.makedirs(os.path.dirname(target), exist_ok=True)\n"
        "        with open(target, 'wb') as out:\n"
        "            out.write(base64.b64decode(data))\n"
        "    sys.path.insert(0, root)\n"
        "    os.chdir(root)\n"
        "\n"
        "_materialize()\n"
        "del _materialize\n"
        f"{imports}"
    )


def unchecked(detail: str, limits: SandboxLimits) -> Graded:
    """A score of 0 for a final workspace no check can take (what its agent made of it)."""
    result = ExecutionResult(
        status=ExecStatus.FAILED, tests_total=1, limits=limits, detail=f"scored 0: {detail}"
    )
    return Graded(result, 0.0)


async def check_functions(
    backend: SandboxBackend, workspace: Manifest, contents: Mapping[str, bytes], check: Check,
    tests: str, limits: SandboxLimits,
) -> Graded:  # fmt: skip
    copied = await asyncio.to_thread(program_files, workspace, contents)  # off the event loop:
    if isinstance(copied, str):  # a tree's links and files take up to a second to gather,
        return unchecked(copied, limits)  # its 8 MiB to encode
    program = await asyncio.to_thread(functions_program, copied.files, check.modules)
    try:
        result = await backend.run(program, tests, check_limits(check, limits))
    except JobTooLarge as exc:  # the same on every retry: scored, never retried for ever
        return unchecked(f"the final workspace makes a program too large to send: {exc}", limits)
    if copied.left_out:  # a module that needed what was left out: the verdict says why
        note = f"not copied from the workspace: {copied.left_out}"
        result = result.model_copy(
            update={"detail": "; ".join(filter(None, [result.detail, note]))}
        )
    if result.status is ExecStatus.PASSED:
        return Graded(result, 1.0)
    score = result.tests_passed / result.tests_total if result.tests_total else 0.0
    return Graded(result, min(score, 1.0))


async def check_script(
    runner: CommandRunner, scratch: Path, spec: WorkspaceSpec, check: Check, uid: int,
    limits: SandboxLimits, slot_name: str,
) -> Graded:  # fmt: skip
    """Run Harbor's test script over `scratch/ws` (the final workspace, owned by `uid`) with
    `scratch/tests` at /tests; `scratch/logs` becomes /logs/verifier."""
    if linked := await asyncio.to_thread(verifier_links, scratch / "ws", spec.workdir):
        return unchecked(f"{FORGED_LINKS}: {'; '.join(linked)}", limits)
    logs = scratch / "logs"
    logs.mkdir()
    logs.chmod(0o1777)  # root's (a root worker's), sticky: the script's code cannot chmod it
    mounts = Mounts(
        workspace=scratch / "ws",
        workdir=spec.workdir,
        extra=((scratch / "tests", TESTS_DIR, False), (logs, LOGS_DIR, True)),
        env=verifier_env(spec.workdir, check),
        sealed=True,
    )
    # the caller's limits (its limits_of, under the worker's cap): a smaller ask lowers them
    limits = check_limits(check, spec.limits_of(limits, limits.memory_mb))  # never raises
    command = script_command(read_head(scratch / "tests", check.tests), check.tests)
    ran = await runner.run(command, mounts, uid, limits, slot_name, own_time=True)
    if ran.status in (ExecStatus.TIMEOUT, ExecStatus.MEMORY_EXCEEDED):
        return Graded(_result(ran, runner, limits, ran.status, 0.0), 0.0)
    try:
        reward = read_reward(logs, check, ran)
    except BadReward as exc:
        result = _result(ran, runner, limits, ExecStatus.FAILED, 0.0, f"scored 0: {exc}")
        raise BadReward(str(exc), Graded(result, 0.0)) from None
    if ran.exit_code != 0:
        detail = f"scored 0: {exited(reward, check, ran)}"
        return Graded(_result(ran, runner, limits, ExecStatus.FAILED, 0.0, detail), 0.0)
    status = ExecStatus.PASSED if reward >= 1.0 else ExecStatus.FAILED
    return Graded(_result(ran, runner, limits, status, reward), reward)


def exited(reward: float, check: Check, ran: CommandResult) -> str:
    """Why a script that exited non-zero (a signal too: 128 + its number) scores 0 whatever
    `reward` it left: the workspace's code ran in it and could have written one, then ended it."""
    why = f"tests/{check.tests} exited {ran.exit_code}: {EXIT_0_RULE}"
    left = f"the reward it left, {reward:g}, is ignored"
    return f"{why} ({left}); stderr: {ran.stderr.strip()[-300:]!r}"


def read_head(tests: Path, name: str) -> bytes:
    """The first `MAX_SHEBANG` bytes of the test script `name` in `tests` (the hidden tests,
    laid out by the verifier), opened one component at a time without following a link, never
    a FIFO waited on; `InvalidTask` where the tests hold no such file."""
    parts = name.split("/")
    if name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise InvalidTask(f"the hidden tests' script {name!r} is not a path inside them")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    below_flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    directory = os.open(tests, below_flags)
    try:
        for part in parts[:-1]:
            below = os.open(part, below_flags, dir_fd=directory)
            os.close(directory)
            directory = below
        fd = os.open(parts[-1], flags, dir_fd=directory)
    except OSError as exc:
        raise InvalidTask(f"the hidden tests hold no tests/{name} ({exc.strerror})") from None
    finally:
        os.close(directory)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a directory opens, a FIFO too (no wait)
            raise InvalidTask(f"the hidden tests' tests/{name} is not a regular file")
        return os.read(fd, MAX_SHEBANG)
    finally:
        os.close(fd)


def shebang(head: bytes, name: str) -> tuple[str, str | None] | None:
    """The interpreter and its one argument (None: none) of the script whose first bytes are
    `head`, read as Linux reads a `#!` line (binfmt_script: the line after `#!`, spaces and
    tabs around it dropped, the interpreter up to the first space or tab, the rest one
    argument); None when it has none (no `#!`, or nothing after it: the kernel refuses it, and
    the shell that ran it runs it as a script). `InvalidTask` for a line the kernel would cut
    (longer than `MAX_SHEBANG` bytes) or one no command can name (a NUL, not UTF-8)."""
    if not head.startswith(b"#!"):
        return None
    line, newline, _ = head[2:].partition(b"\n")
    if not newline and len(head) >= MAX_SHEBANG:
        raise InvalidTask(f"tests/{name}: its #! line is longer than {MAX_SHEBANG - 1} bytes")
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidTask(f"tests/{name}: its #! line is not UTF-8") from None
    if "\0" in text:
        raise InvalidTask(f"tests/{name}: its #! line holds a NUL")
    text = text.strip(" \t")
    if not text:
        return None
    end = next((at for at, char in enumerate(text) if char in " \t"), len(text))
    return text[:end], text[end:].lstrip(" \t") or None


def script_command(head: bytes, name: str) -> str:
    """The command that runs the test script `name` (whose first bytes are `head`) as Harbor
    runs it: as a program, which the kernel runs with its `#!` line's interpreter (`shebang`).
    A script whose interpreter is sh or bash (the file a sealed shell copies, or `env sh`/`env
    bash`), or that has none (Harbor's bash then runs it), runs that shell's execute-only copy
    (`sealed.py`), its argument kept; another interpreter runs as the kernel would run it."""
    script = shlex.quote(f"{TESTS_DIR}/{name}")
    found = shebang(head, name)
    if found is None:
        return f"{SEALED_DIR}/bash {script}"
    interpreter, argument = found
    shell = _sealed(interpreter, argument)
    if shell is not None:
        program, argument = shell
    else:  # a name without a slash is the kernel's to open in the working directory, not PATH's
        program = shlex.quote(interpreter if "/" in interpreter else f"./{interpreter}")
    return " ".join([program, *([shlex.quote(argument)] if argument else []), script])


def _sealed(interpreter: str, argument: str | None) -> tuple[str, str | None] | None:
    """The sealed shell (its path in the sandbox) and argument that stand for `interpreter`
    `argument`, if it is sh or bash; None for any other program."""
    if not interpreter.startswith("/"):
        return None
    real = os.path.realpath(interpreter)
    if posixpath.basename(real) == "env" and argument in SHELLS:
        return f"{SEALED_DIR}/{argument}", None
    name = posixpath.basename(interpreter)
    for shell in sorted(SHELLS, key=lambda shell: shell != name):  # `sh` named: bash as sh
        program = SHELLS[shell]
        if real == os.path.realpath(shutil.which(program) or program):
            return f"{SEALED_DIR}/{shell}", argument
    return None


def read_reward(logs: Path, check: Check, ran: CommandResult) -> float:
    """The score the script left in `logs` (`verifier_files.left_reward`: reward.txt, else
    reward.json), or `BadReward` saying why not, whatever the script's exit status, as Harbor's
    verifier (a missing interpreter's 127, `set -e` before the reward: scored every tree 0)."""
    where = f"tests/{check.tests}"
    ended = f"{where} exited {ran.exit_code}" if ran.exit_code not in (0, None) else ""
    try:
        reward = left_reward(logs, where)
    except RewardError as exc:
        raise BadReward(f"{ended}: {exc}" if ended else str(exc)) from None
    if reward is None:
        raise BadReward(
            f"{f'{ended} and' if ended else where} wrote no reward to {LOGS_DIR}/{REWARD_FILE} "
            f"or {LOGS_DIR}/{REWARD_JSON} ({ran.detail or 'exit status 0'}; it must write one, "
            f"0 where its tests fail); stderr: "
            f"{ran.stderr.strip()[-300:]!r}"
        )
    return reward


def _result(
    ran: CommandResult,
    runner: CommandRunner,
    limits: SandboxLimits,
    status: ExecStatus,
    reward: float,
    detail: str = "",
) -> ExecutionResult:
    return ExecutionResult(
        status=status,
        exit_code=ran.exit_code,
        duration_ms=ran.duration_ms,
        stdout=ran.stdout,
        stderr=ran.stderr,
        truncated=ran.truncated,
        tests_passed=1 if reward >= 1.0 else 0,
        tests_total=1,
        backend="local",
        limits=limits,
        enforcement="cgroup" if runner.use_cgroups else "rlimit",
        detail=detail or ran.detail or f"reward {reward:g}",
    )
