"""The local backend (the two-process verifier under bwrap) through its public API: statuses,
tests, limits, output caps, the warm pool, failing closed, and `tempered sandbox run`."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator

import psutil
import pytest
import pytest_asyncio

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox import SandboxInfraError, get_backend, verifier
from infra.sandbox.cgroups import CGROUP_CONTROLLERS, CGROUP_ROOT, Cgroups, sweep_dead_workers
from infra.sandbox.judge import unproven_memory
from infra.sandbox.local import LocalBackend, worker_uids
from infra.settings import Settings

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bwrap and root"
)

CHECK = "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n"
FAST = SandboxLimits(timeout_s=5)


@pytest_asyncio.fixture
async def backend() -> AsyncIterator[LocalBackend]:
    """One backend per test: a backend's zygotes belong to the event loop that started them."""
    local = LocalBackend(warm=1)
    yield local
    await local.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("program", "tests", "entry_point", "status", "passed", "total"),
    [
        ("def add(a, b):\n    return a + b\n", CHECK, "add", ExecStatus.PASSED, 1, 1),
        ("def add(a, b):\n    return a - b\n", CHECK, "add", ExecStatus.FAILED, 0, 1),
        ("def add(a, b):\n    return a +\n", CHECK, "add", ExecStatus.ERROR, 0, 1),
        ("def add(a, b):\n    return a / 0\n", CHECK, "add", ExecStatus.ERROR, 0, 1),
        ("def plus(a, b):\n    return a + b\n", CHECK, "add", ExecStatus.ERROR, 0, 1),
        ("raise ValueError('boom')\n", CHECK, "add", ExecStatus.ERROR, 0, 1),
        (
            "def f(x):\n    return 2 * x\n",
            "assert f(1) == 2\nassert f(2) == 4\n",
            None,
            ExecStatus.PASSED,
            2,
            2,
        ),
        (
            "def f(x):\n    return 2 * x\n",
            "assert f(1) == 2\nassert f(2) == 5\nassert f(3) == 6\n",
            None,
            ExecStatus.FAILED,
            2,
            3,
        ),
        ("print('hello')\n", "", None, ExecStatus.PASSED, 0, 0),
        ("import sys\nsys.exit(3)\n", "", None, ExecStatus.FAILED, 0, 0),
        ("x = [1, 2\n", "", None, ExecStatus.ERROR, 0, 0),
    ],
)
async def test_statuses(backend, program, tests, entry_point, status, passed, total) -> None:
    result = await backend.run(program, tests, FAST, entry_point)
    assert (result.status, result.tests_passed, result.tests_total) == (status, passed, total), (
        result
    )
    assert result.backend == "local" and result.limits == FAST


@pytest.mark.asyncio
async def test_failure_reports_the_failing_line(backend) -> None:
    result = await backend.run("def add(a, b):\n    return a - b\n", CHECK, FAST, "add")
    assert 'File "tests.py", line 2, in check' in result.stderr
    assert "AssertionError" in result.stderr and result.detail == "AssertionError"


@pytest.mark.asyncio
async def test_setup_in_tests_sees_the_program(backend) -> None:
    tests = "import math\nHELPER = math.sqrt(4)\nassert f(HELPER) == 4.0\n"
    result = await backend.run("def f(x):\n    return x * 2\n", tests, FAST)
    assert result.status == ExecStatus.PASSED and result.tests_total == 1


@pytest.mark.asyncio
async def test_stdlib_introspection_still_works(backend) -> None:
    program = (
        "import re, json, typing, dataclasses, enum, threading, socket, logging, collections\n"
        "from typing import List\n@dataclasses.dataclass\nclass P:\n    x: int\n"
        "Pair = collections.namedtuple('Pair', 'a b')\nlogging.getLogger('t').warning('w')\n"
        "def add(a: int, b: int) -> int:\n    return P(a).x + Pair(b, 0).a\n"
    )
    result = await backend.run(program, CHECK, FAST, "add")
    assert result.status == ExecStatus.PASSED, result


@pytest.mark.asyncio
async def test_timeout(backend) -> None:
    sleeper = "import time\ntime.sleep(60)\n"  # its own time, however loaded the host is
    result = await backend.run(sleeper, CHECK, SandboxLimits(timeout_s=1), "add")
    assert result.status == ExecStatus.TIMEOUT
    assert 1000 <= result.duration_ms < 4000


@pytest.mark.slow
@pytest.mark.asyncio
async def test_cpu_limit_is_a_timeout(backend) -> None:
    limits = SandboxLimits(timeout_s=60, cpu_s=1)
    result = await backend.run("while True:\n    pass\n", "", limits)
    assert result.status == ExecStatus.TIMEOUT and "CPU limit" in result.detail, result


@pytest.mark.asyncio
async def test_a_program_may_read_its_limits_but_not_change_them(backend) -> None:
    """A CPU limit the program lowered ended it with a SIGKILL the host took for a foreign one:
    a platform fault, retried without end. Changing any limit is refused (EPERM) now; the
    program runs on to the limit the run set."""
    program = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_CPU)\n"
        "for change in ((1, 1), (soft, soft), (0, hard)):\n"
        "    try:\n"
        "        resource.setrlimit(resource.RLIMIT_CPU, change)\n"
        "    except (OSError, ValueError) as exc:\n"
        "        print(exc, flush=True)  # EPERM, which Python words as a raise\n"
        "print(resource.prlimit(0, resource.RLIMIT_CPU) == (soft, hard), flush=True)\n"
        "while True:\n"
        "    pass\n"
    )
    limits = SandboxLimits(timeout_s=30, cpu_s=1)
    result = await backend.run(program, "", limits)
    assert result.status == ExecStatus.TIMEOUT and "CPU limit" in result.detail, result
    refused = ["not allowed to raise maximum limit"] * 3
    assert result.stdout.split("\n")[:4] == [*refused, "True"], result.stdout


@pytest.mark.asyncio
async def test_memory_exceeded_large_allocation(backend) -> None:
    result = await backend.run("x = bytearray(8 * 2**30)\n", CHECK, FAST, "add")
    # refused before it used memory: memory_exceeded only where nothing else can tell
    assert result.status == unproven_memory(result.backend, result.enforcement), result
    assert "MemoryError" in result.stderr


@pytest.mark.asyncio
async def test_memory_exceeded_gradual_growth(backend) -> None:
    grow = "chunks = []\nwhile True:\n    chunks.append(bytearray(1 << 20))\n"
    result = await backend.run(grow, "", SandboxLimits(timeout_s=20, memory_mb=64))
    assert result.status == ExecStatus.MEMORY_EXCEEDED, result


@pytest.mark.asyncio
async def test_output_is_truncated(backend) -> None:
    limits = SandboxLimits(timeout_s=5, output_bytes=1000)
    result = await backend.run(
        "print('x' * 5000)\nimport sys\nprint('e' * 3000, file=sys.stderr)\n", "", limits
    )
    assert result.status == ExecStatus.PASSED and result.truncated
    # the first and the latest halves of each stream, a note in place of the rest
    for text, char, came in ((result.stdout, "x", 5001), (result.stderr, "e", 3001)):
        assert len(text) == 1000 and f"of its {came} bytes left out ...]" in text, text
        assert text.startswith(char * 400) and text.rstrip("\n").endswith(char * 400), text


@pytest.mark.asyncio
async def test_small_output_is_not_truncated(backend) -> None:
    result = await backend.run("print('ok')\n", "", FAST)
    assert result.stdout == "ok\n" and not result.truncated


@pytest.mark.asyncio
async def test_enforcement_reports_cgroups_when_available(backend) -> None:
    result = await backend.run("print(1)\n", "", FAST)
    expected = "cgroup" if os.access("/sys/fs/cgroup/memory", os.W_OK) else "rlimit"
    assert result.enforcement == backend.enforcement == expected


@pytest.mark.alone
@pytest.mark.asyncio
async def test_a_fresh_boot_without_tempered_cgroups_still_runs() -> None:
    """After a reboot no `tempered` cgroup folder exists; the candidate zygote binds it, so the
    backend must make it (found on a fresh machine: every run was an infra error)."""
    if not Cgroups.available():
        pytest.skip("needs writable cgroups v1")
    sweep_dead_workers()  # groups the suite's ended processes left (a fresh boot has none)
    for ctl in CGROUP_CONTROLLERS:
        folder = CGROUP_ROOT / ctl / "tempered"
        if folder.is_dir():
            if any(p.is_dir() for p in folder.iterdir()):
                pytest.skip(f"{folder} holds groups of running sandboxes")
            try:
                folder.rmdir()  # a cgroup folder without child groups is removed by rmdir
            except OSError as exc:  # e.g. still bound by a running zygote
                pytest.skip(f"cannot remove {folder}: {exc}")
    backend = LocalBackend(warm=0)
    try:
        result = await backend.run("print('ok')\n", "", FAST)
    finally:
        await backend.close()
    assert result.status == ExecStatus.PASSED and result.enforcement == "cgroup"


@pytest.mark.asyncio
async def test_rlimit_mode_still_enforces_memory() -> None:
    backend = LocalBackend(warm=0)
    backend.verifier.use_cgroups, backend.verifier.enforcement = False, "rlimit"
    try:
        limits = SandboxLimits(memory_mb=128)
        result = await backend.run("x = bytearray(300 * 2**20)\n", "", limits)
    finally:
        await backend.close()
    assert result.status == ExecStatus.MEMORY_EXCEEDED and result.enforcement == "rlimit"


@pytest.mark.asyncio
async def test_missing_bwrap_is_an_infra_error() -> None:
    backend = LocalBackend()
    backend.verifier.bwrap = None
    with pytest.raises(SandboxInfraError, match="needs root, bwrap and setpriv"):
        await backend.run("print(1)\n")


@pytest.mark.asyncio
async def test_without_root_it_fails_closed_with_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verifier.os, "geteuid", lambda: 1000)
    with pytest.raises(SandboxInfraError, match="needs root") as raised:
        await LocalBackend(warm=0).run("print(1)\n")
    assert "\n" not in str(raised.value)


def test_get_backend_dispatches_by_name() -> None:
    settings = Settings()
    assert get_backend(settings).name == "local"
    assert get_backend(settings, "gvisor").name == "gvisor"
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        get_backend(settings, "docker")


def _live_sandbox_processes() -> int:
    return sum(
        1
        for p in psutil.process_iter(["uids", "status"])
        if p.info["uids"] and p.info["uids"].real in worker_uids() and p.info["status"] != "zombie"
    )


@pytest.mark.asyncio
async def test_warm_pool_runs_each_program_in_a_fresh_sandbox() -> None:
    backend = LocalBackend(warm=2)
    leave_traces = (
        "import os, time\nopen('/tmp/trace', 'w').write('secret')\n"
        "if os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\n"
    )
    look = "import os\nprint(os.path.exists('/tmp/trace'), [p for p in os.listdir('/proc') if p.isdigit()])\n"
    try:
        await backend.run(leave_traces, "", FAST)
        await backend.run(leave_traces, "", FAST)
        pool = backend.verifier._pool
        for _ in range(100):
            if sum(len(pairs) for pairs in pool.values()) == 2:
                break
            await asyncio.sleep(0.05)
        assert sum(len(pairs) for pairs in pool.values()) == 2
        result = await backend.run(look, "", FAST)  # served by a pre-started pair
        assert result.stdout == "False ['1']\n", result  # no file, and it is alone: pid 1
        limited = await backend.run("x = bytearray(200 * 2**20)\n", "", SandboxLimits(memory_mb=64))
        assert limited.status == ExecStatus.MEMORY_EXCEEDED  # limits are applied per run
    finally:
        await backend.close()
    for _ in range(40):
        if _live_sandbox_processes() == 0:
            break
        await asyncio.sleep(0.05)
    assert _live_sandbox_processes() == 0


def test_cli_sandbox_run_prints_json_and_exits_0(tmp_path, capsys) -> None:
    from workers.cli import run as cli

    program, tests = tmp_path / "p.py", tmp_path / "t.py"
    program.write_text("def add(a, b):\n    return a - b\n")
    tests.write_text(CHECK)
    argv = ["sandbox", "run", str(program), "--tests", str(tests), "--entry-point", "add"]
    assert cli([*argv, "--json", "--timeout", "5", "--memory-mb", "128"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["status"] == "failed" and printed["tests_total"] == 1
    assert printed["limits"]["memory_mb"] == 128 and printed["backend"] == "local"
    assert {"exit_code", "duration_ms", "stdout", "stderr", "truncated", "tests_passed"} <= set(
        printed
    )


def test_cli_sandbox_run_uses_the_task_helpers(tmp_path, capsys) -> None:
    from workers.cli import run as cli

    files = {
        "p.py": "def encode(s):\n    return s\n",  # a cheat: its own helper is the identity
        "t.py": "assert decode(encode('abc')) == 'abc'\nassert encode('abc') == 'bcd'\n",
        "h.py": "def decode(s):\n    return ''.join(chr(ord(c) - 1) for c in s)\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    argv = ["sandbox", "run", str(tmp_path / "p.py"), "--tests", str(tmp_path / "t.py")]
    assert cli([*argv, "--helpers", str(tmp_path / "h.py"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["status"] == "failed" and printed["tests_passed"] == 0, printed


def hidden_case(tmp_path, hidden: str) -> list[str]:
    """`sandbox run` argv of a wrong `add` (0 from 10 on), the shown CHECK and `hidden`."""
    files = {
        "p.py": "def add(a, b):\n    return a + b if a < 10 else 0\n",
        "t.py": CHECK,
        "h.py": hidden,
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    argv = ["sandbox", "run", str(tmp_path / "p.py"), "--tests", str(tmp_path / "t.py")]
    return [*argv, "--hidden-tests", str(tmp_path / "h.py"), "--entry-point", "add", "--json"]


def test_cli_sandbox_run_takes_hidden_tests(tmp_path, capsys) -> None:
    from workers.cli import run as cli

    assert cli(hidden_case(tmp_path, "assert add(40, 2) == 42\n")) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["status"] == "failed" and (printed["tests_passed"], printed["tests_total"]) == (
        1,
        2,
    )
    assert printed["stderr"] == "a hidden test failed (AssertionError)\n", printed


def test_cli_sandbox_run_refuses_hidden_tests_in_check_form(tmp_path, capsys) -> None:
    """Hidden `def check(candidate)` was one unit that only defined `check` (the shown `check`
    had been called): a wrong `add` printed status passed, 2/2."""
    from workers.cli import run as cli

    assert (
        cli(hidden_case(tmp_path, "def check(candidate):\n    assert candidate(40, 2) == 42\n"))
        == 2
    )
    captured = capsys.readouterr()
    assert not captured.out, captured.out  # nothing run
    assert captured.err.startswith(
        f"tempered sandbox: {tmp_path / 'h.py'}: they define check(candidate), which nothing calls"
    ), captured.err


def test_cli_sandbox_run_infra_error_exits_3(tmp_path, capsys, monkeypatch) -> None:
    from workers.cli import run as cli

    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH: the platform is broken
    program = tmp_path / "p.py"
    program.write_text("print(1)\n")
    assert cli(["sandbox", "run", str(program), "--json"]) == 3
    captured = capsys.readouterr()
    assert json.loads(captured.out)["status"] == "infra_error" and "infra_error" in captured.err
