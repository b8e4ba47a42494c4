"""Hostile programs against every backend that can run here (local bwrap, gVisor).

Host safety: no network (loopback included), no host files or environment, no writes outside
the work dir, nothing left running, fork/memory/output bombs contained. Reward safety: every
known way to fake a pass gets `failed` (or `error`), never `passed`. gVisor cases are slow.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import textwrap
from pathlib import Path

import psutil
import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox.gvisor import GVisorBackend
from infra.sandbox.local import LocalBackend, worker_uids
from tests.paths import REPO_ROOT

CANARY = "tempered-canary-7f3a"
FAST = SandboxLimits(timeout_s=5)
CHECK = "def check(candidate):\n    assert candidate(2, 3) == 5\n"
WRONG = "def add(a, b):\n    return a - b\n"
NOT_PASSED = (ExecStatus.FAILED, ExecStatus.ERROR)


def _runsc_works() -> str | None:
    if shutil.which("runsc") is None or os.geteuid() != 0:
        return "runsc missing or not root"
    return None


@pytest.fixture(
    scope="module",
    params=[
        "local",
        pytest.param(
            "gvisor",
            marks=[
                pytest.mark.slow,
                pytest.mark.skipif(bool(_runsc_works()), reason=str(_runsc_works())),
            ],
        ),
    ],
)
def backend(request: pytest.FixtureRequest) -> LocalBackend | GVisorBackend:
    if shutil.which("bwrap") is None or os.geteuid() != 0:
        pytest.skip("needs bwrap and root")
    return LocalBackend(warm=0) if request.param == "local" else GVisorBackend()


def _run(backend, program: str, tests: str = "", entry_point: str | None = None, limits=FAST):  # type: ignore[no-untyped-def]
    import asyncio

    return asyncio.run(
        backend.run(textwrap.dedent(program), textwrap.dedent(tests), limits, entry_point)
    )


def _sandbox_processes() -> list[psutil.Process]:
    """Live processes of this test process's sandboxes (other workers may run on the host;
    zombies hold no resources and the host's init reaps them)."""
    mine, runsc_state = worker_uids(), f"tempered-runsc-{os.getpid()}"
    left = []
    for proc in psutil.process_iter(["uids", "cmdline", "status"]):
        if proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        uids, cmdline = proc.info["uids"], " ".join(proc.info["cmdline"] or [])
        if (uids and uids.real in mine) or runsc_state in cmdline:
            left.append(proc)
    return left


# --- host safety ----------------------------------------------------------------------------


def test_no_network_not_even_host_loopback(backend) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        result = _run(
            backend,
            f"""
            import socket
            for address in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
                s = socket.socket()
                s.settimeout(2)
                try:
                    s.connect(address)
                    print("CONNECTED", address)
                except OSError as exc:
                    print("blocked", address, type(exc).__name__)
        """,
        )
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()
    assert result.status == ExecStatus.PASSED, result
    assert "CONNECTED" not in result.stdout and result.stdout.count("blocked") == 3


def test_cannot_read_host_files(backend) -> None:
    paths = [
        "/etc/shadow",
        "/etc/passwd",
        "/root",
        "/home",
        str(REPO_ROOT),
        str(REPO_ROOT / "pyproject.toml"),
        "/work",
    ]
    result = _run(
        backend,
        f"""
        import os
        for path in {paths!r}:
            try:
                print("LEAK", path, os.listdir(path) if os.path.isdir(path) else open(path).read()[:20])
            except OSError as exc:
                print("denied", path, type(exc).__name__)
        print("environ1", open("/proc/1/environ").read() if os.path.exists("/proc/1/environ") else "")
    """,
    )
    assert result.status == ExecStatus.PASSED, result
    assert "LEAK" not in result.stdout and result.stdout.count("denied") == len(paths)


def test_cannot_write_outside_the_work_dir(backend, tmp_path: Path) -> None:
    target = tmp_path / "escaped"
    result = _run(
        backend,
        f"""
        for path in ["/usr/escaped", "/escaped", "/etc/escaped", "{target}", "/var/tmp/escaped"]:
            try:
                open(path, "w").write("x")
                print("WROTE", path)
            except OSError:
                print("denied", path)
        open("/tmp/inside", "w").write("fine")
        print(open("/tmp/inside").read())
    """,
    )
    assert "WROTE" not in result.stdout and "fine" in result.stdout, result
    assert (
        not target.exists() and not Path("/usr/escaped").exists() and not Path("/escaped").exists()
    )


def test_environment_is_clean(backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TEMPERED_CANARY", CANARY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CANARY)
    result = _run(
        backend,
        """
        import os
        print(dict(os.environ))
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    print(open(f"/proc/{pid}/environ").read())
                except OSError:
                    pass
    """,
    )
    assert result.status == ExecStatus.PASSED, result
    assert (
        CANARY not in result.stdout
        and "TEMPERED_" not in result.stdout
        and "AWS_" not in result.stdout
    )


def test_fork_bomb_is_contained(backend) -> None:
    result = _run(
        backend,
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
    """,
        limits=SandboxLimits(timeout_s=3),
    )
    assert result.status in (ExecStatus.TIMEOUT, ExecStatus.ERROR, ExecStatus.FAILED), result
    assert _sandbox_processes() == []


def test_memory_bomb_is_contained(backend) -> None:
    result = _run(
        backend, "x = bytearray(16 * 2**30)\n", limits=SandboxLimits(timeout_s=10, memory_mb=128)
    )
    assert result.status == ExecStatus.MEMORY_EXCEEDED, result


def test_cpu_spin_times_out_and_leaves_nothing(backend) -> None:
    result = _run(
        backend,
        """
        import threading
        def spin():
            while True:
                pass
        for _ in range(4):
            threading.Thread(target=spin).start()
        spin()
    """,
        limits=SandboxLimits(timeout_s=1.5),
    )
    assert result.status == ExecStatus.TIMEOUT, result
    assert _sandbox_processes() == []


def test_output_flood_is_capped(backend) -> None:
    result = _run(
        backend,
        """
        import sys
        while True:
            sys.stdout.write("x" * 65536)
            sys.stderr.write("y" * 65536)
    """,
        limits=SandboxLimits(timeout_s=2, output_bytes=4096),
    )
    assert result.status == ExecStatus.TIMEOUT and result.truncated, result
    assert len(result.stdout) <= 4096 and len(result.stderr) <= 4096


def test_orphaned_daemon_does_not_survive(backend) -> None:
    result = _run(
        backend,
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(1000)
            os._exit(0)
        print("parent done")
    """,
    )
    assert result.status == ExecStatus.PASSED and "parent done" in result.stdout, result
    assert _sandbox_processes() == []


def test_killing_the_parent_harms_nobody(backend) -> None:
    result = _run(
        backend,
        """
        import os, signal
        for pid in (os.getppid(), 1):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        def add(a, b):
            return a + b
    """,
        CHECK,
        "add",
    )
    assert result.status in (ExecStatus.PASSED, ExecStatus.FAILED), result  # never an infra fault
    assert os.getppid() > 0 and _sandbox_processes() == []


def test_cannot_fill_the_disk(backend) -> None:
    result = _run(
        backend,
        """
        with open("/tmp/big", "wb") as f:
            while True:
                f.write(b"x" * (1 << 20))
    """,
        limits=SandboxLimits(timeout_s=10, tmpfs_mb=8, file_size_mb=4),
    )
    assert result.status == ExecStatus.ERROR, result
    assert (
        "OSError" in result.stderr
        or "No space" in result.stderr
        or "File too large" in result.stderr
    )


# --- reward safety: every trick on a wrong `add` must not pass --------------------------------

FAKES = {
    "os._exit(0) early": "import os\nos._exit(0)\n",
    "sys.exit(0) early": "import sys\nsys.exit(0)\n",
    "raise SystemExit in check": "def add(a, b):\n    raise SystemExit(0)\n",
    "os._exit(0) in check": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "success markers": (
        "import os, sys\nprint('PASSED\\nOK\\n1/1 tests passed')\n"
        'line = b\'{"ready": true}\\n{"nonce": "0", "status": "passed", "tests_passed": 1, "tests_total": 1}\\n\'\n'
        "for fd in range(1, 64):\n    try:\n        os.write(fd, line)\n    except OSError:\n        pass\n"
    ),
    "own check": "def check(candidate):\n    pass\n",
    "delete and rewrite tests": (
        "import os\nfor d in ('/tmp', '.', '/'):\n    for p in os.listdir(d):\n        try:\n            os.remove(os.path.join(d, p))\n        except OSError:\n            pass\n"
        "open('/tmp/tests.py', 'w').write('def check(c): pass')\n"
    ),
    "patch AssertionError and builtins": (
        "import builtins\nclass Nope(Exception):\n    pass\nbuiltins.AssertionError = Nope\n"
        "builtins.abs = lambda x: 0\nbuiltins.isinstance = lambda *a: True\nAssertionError = Nope\n"
    ),
    "shadow a builtin the tests use": "def abs(x):\n    return 0\n",
    "patch a module the tests use": "import math\nmath.isclose = lambda *a, **k: True\n",
    "kill the harness": "import os, signal\ndef add(a, b):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
    "atexit": (
        "import atexit, os\n"
        'atexit.register(lambda: os.write(3, b\'{"nonce": "x", "status": "passed"}\\n\'))\n'
        "atexit.register(lambda: os._exit(0))\n"
    ),
    "fork and exit": "import os\nif os.fork() != 0:\n    os._exit(0)\n",
    "walk frames for the nonce and forge a verdict": (
        "import os, re, sys\nfound = set()\nf = sys._getframe()\nwhile f is not None:\n"
        "    found.update(re.findall(r'[0-9a-f]{64}', repr(f.f_locals)))\n    f = f.f_back\n"
        "for nonce in found or {'0' * 64}:\n"
        "    line = repr({'nonce': nonce, 'status': 'passed', 'tests_passed': 1, 'tests_total': 1,"
        " 'error': '', 'exc_type': ''})\n"
        "    for fd in range(1, 64):\n        try:\n            os.write(fd, ('\\n' + line + '\\n').encode())\n"
        "        except OSError:\n            pass\n"
    ),
    "other threads' frames": "import sys\nprint(sys._current_frames())\n",
    "walk the heap": "import gc\nprint([o for o in gc.get_objects() if isinstance(o, str) and len(o) == 64])\n",
    "trace the harness": "import sys\nsys.settrace(lambda *a: None)\n",
    "read own memory": "open('/proc/self/mem', 'rb')\n",
}
TESTS_USING_BUILTINS = (
    "import math\n"
    "def check(candidate):\n"
    "    assert abs(candidate(2, 3) - 5) < 1e-9\n"
    "    assert math.isclose(candidate(1, 1), 2)\n"
    "    assert isinstance(candidate(1, 1), int) and candidate(1, 1) == 2\n"
)


@pytest.mark.parametrize("trick", list(FAKES))
def test_reward_faking_never_passes(backend, trick: str) -> None:
    program = FAKES[trick] + ("" if "def add" in FAKES[trick] else WRONG)
    result = _run(backend, program, TESTS_USING_BUILTINS, "add")
    assert result.status in NOT_PASSED, (trick, result)
    assert result.tests_passed == 0 and result.tests_total == 1


def test_the_honest_program_passes_the_same_tests(backend) -> None:
    result = _run(backend, "def add(a, b):\n    return a + b\n", TESTS_USING_BUILTINS, "add")
    assert result.status == ExecStatus.PASSED and result.tests_passed == 1, result


def test_patched_builtins_do_not_leak_into_assert_only_tests(backend) -> None:
    program = "import builtins\nbuiltins.len = lambda x: 3\ndef f(x):\n    return [x]\n"
    result = _run(backend, program, "assert len(f(1)) == 3\n")
    assert result.status == ExecStatus.FAILED and result.tests_passed == 0, result


def test_no_sandbox_process_is_left_at_the_end() -> None:
    subprocess.run(["sync"], check=False)
    assert _sandbox_processes() == []
