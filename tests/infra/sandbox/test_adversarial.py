"""Hostile programs against every backend that can run here (local, then gVisor).

Reward safety: every attack of `attacks.py` (a wrong program plus one trick of a class issue 10
names) ends in a status other than `passed`, with no test counted as passed, and never as a
platform fault (a program must not turn its failure into a retried infra_error either); the
honest program passes the very same tests. Host safety: no network (loopback included), no
host files or environment, no writes outside the run's tmpfs, nothing left running, fork,
memory, CPU, output and disk bombs contained. Needs root and bwrap (and runsc for gVisor).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox.judge import unproven_memory
from infra.tasks.humaneval import humaneval_tasks
from tests.infra.sandbox.attacks import CASES, OUTLIVING, REDEFINED_HELPERS, TESTS, WRONG
from tests.infra.sandbox.verifier_box import Box, needs_root
from tests.paths import REPO_ROOT

pytestmark = needs_root
LIMITS = SandboxLimits(timeout_s=2)
"""Short deadlines: a program spinning until one passes must get that much CPU within
`judge.starvation_bound`, or its run is (rightly) the host's fault, on a loaded host too."""
CANARY = "tempered-canary-7f3a"
ADD = "def add(a, b):\n    return a + b\n"


# --- reward safety -------------------------------------------------------------------------


@pytest.mark.parametrize(("trick", "program"), CASES, ids=[trick for trick, _ in CASES])
def test_a_wrong_program_never_passes(any_box: Box, trick: str, program: str) -> None:
    result = any_box.run(program, TESTS, "add", limits=LIMITS)
    result.model_dump_json()  # what the activity returns: any report must serialise
    assert result.status != ExecStatus.PASSED, (trick, result)
    assert result.tests_passed == 0 and result.tests_total == 1, (trick, result)
    assert "FOUND THE TESTS" not in result.stdout and "EXTRA FD" not in result.stdout, result


def test_the_honest_program_passes_the_same_tests(any_box: Box) -> None:
    result = any_box.run(ADD, TESTS, "add", limits=LIMITS)
    assert result.status == ExecStatus.PASSED and result.tests_passed == 1, result


def test_nothing_forged_outlives_the_check(any_box: Box) -> None:
    """The attack runs here, not only in the parametrized test above (which may be deselected):
    its daemon leaves the candidate's session, marks its /tmp `outlive`, and forges verdicts
    after the check; once the run has ended it must be gone."""
    attack = OUTLIVING["a daemon forges after the check"] + WRONG
    result = any_box.run(attack, TESTS, "add", limits=LIMITS)
    assert result.status != ExecStatus.PASSED and result.tests_passed == 0, result
    assert any_box.leftovers("outlive") == []


@pytest.mark.parametrize(
    "program",
    [
        "def is_even(x):\n    raise StopIteration\n",
        "def is_even(x):\n    raise StopAsyncIteration\n",
        "class StopIteration(Exception):\n    pass\ndef is_even(x):\n    raise StopIteration\n",
    ],
    ids=["StopIteration", "StopAsyncIteration", "its own class named StopIteration"],
)
def test_raising_stop_iteration_cannot_end_a_tests_loop_early(any_box: Box, program: str) -> None:
    tests = (
        "assert all(map(is_even, [2, 3, 4]))\nassert not any(map(is_even, [3]))\n"
        "assert list(filter(is_even, [3])) == []\n"
    )
    result = any_box.run(program, tests, limits=LIMITS)
    assert result.status == ExecStatus.ERROR and result.tests_passed == 0, result


def test_the_checkers_refusal_to_send_an_argument_is_not_the_programs_error(
    any_box: Box,
) -> None:
    """Arguments that are not plain data cannot reach the program; a test expecting it to
    reject them must not pass on the checker's own refusal (a TypeError it could catch)."""
    tests = (
        "def check(candidate):\n    for bad in (object(), range(3), bytearray(b'x')):\n"
        "        try:\n            candidate(bad, 1)\n        except TypeError:\n"
        "            pass\n        else:\n            assert False\n"
    )
    result = any_box.run("def add(a, b):\n    return a - b\n", tests, "add", limits=LIMITS)
    assert result.status != ExecStatus.PASSED and result.tests_passed == 0, result


@pytest.mark.parametrize(
    "program",
    [
        "import os\ndef add(a, b):\n    os._exit(0)\n",
        "import time\ndef add(a, b):\n    time.sleep(60)\n",
    ],
    ids=["exits", "hangs"],
)
def test_a_lost_candidate_ends_the_run_even_if_the_test_catches_it(
    any_box: Box, program: str
) -> None:
    tests = (
        "def check(candidate):\n    try:\n        result = candidate(2, 3)\n"
        "    except BaseException:\n        result = 5  # a test that tolerates any error\n"
        "    assert result == 5\n"
    )
    result = any_box.run(program, tests, "add", limits=SandboxLimits(timeout_s=1))
    assert result.status in (ExecStatus.FAILED, ExecStatus.TIMEOUT), result
    assert result.tests_passed == 0, result


def test_patched_builtins_do_not_leak_into_assert_only_tests(any_box: Box) -> None:
    program = "import builtins\nbuiltins.len = lambda x: 3\ndef f(x):\n    return [x]\n"
    result = any_box.run(program, "assert len(f(1)) == 3\n", limits=LIMITS)
    assert result.status == ExecStatus.FAILED and result.tests_passed == 0, result


@pytest.mark.parametrize("number", sorted(REDEFINED_HELPERS))
def test_redefining_task_helpers_changes_nothing(any_box: Box, number: int) -> None:
    task = humaneval_tasks()[number]
    limits = SandboxLimits(timeout_s=30)
    cheat = any_box.run(
        REDEFINED_HELPERS[number], task.tests, task.entry_point, task.helpers, limits
    )
    assert cheat.status != ExecStatus.PASSED and cheat.tests_passed == 0, cheat
    honest = any_box.run(
        task.canonical_solution or "", task.tests, task.entry_point, task.helpers, limits
    )
    assert honest.status == ExecStatus.PASSED, honest


# --- host safety ---------------------------------------------------------------------------


def test_no_network_not_even_host_loopback(any_box: Box) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        result = any_box.run(f"""
            import socket
            for address in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
                s = socket.socket()
                s.settimeout(2)
                try:
                    s.connect(address)
                    print("CONNECTED", address)
                except OSError as exc:
                    print("blocked", address, type(exc).__name__)
        """)
        listener.settimeout(0.2)
        with pytest.raises(TimeoutError):
            listener.accept()
    finally:
        listener.close()
    assert result.status == ExecStatus.PASSED, result
    assert "CONNECTED" not in result.stdout and result.stdout.count("blocked") == 3


def test_cannot_read_host_files_or_environment(
    any_box: Box, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEMPERED_CANARY", CANARY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", CANARY)
    paths = ["/etc/shadow", "/etc/passwd", "/root", "/home", str(REPO_ROOT), "/work"]
    paths.append(str(REPO_ROOT / "pyproject.toml"))
    result = any_box.run(f"""
        import os
        for path in {paths!r}:
            try:
                print("LEAK", path, os.listdir(path) if os.path.isdir(path) else open(path).read()[:20])
            except OSError as exc:
                print("denied", path, type(exc).__name__)
        print(dict(os.environ))
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    print(open(f"/proc/{{pid}}/environ").read())
                except OSError:
                    pass
    """)
    assert result.status == ExecStatus.PASSED, result
    assert "LEAK" not in result.stdout and result.stdout.count("denied") == len(paths)
    assert CANARY not in result.stdout and "TEMPERED_" not in result.stdout


def test_cannot_write_outside_its_tmpfs(any_box: Box, tmp_path: Path) -> None:
    target = tmp_path / "escaped"
    result = any_box.run(f"""
        for path in ["/usr/escaped", "/escaped", "/etc/escaped", "{target}", "/var/tmp/escaped"]:
            try:
                open(path, "w").write("x")
                print("WROTE", path)
            except OSError:
                print("denied", path)
        open("/tmp/inside", "w").write("fine")
        print(open("/tmp/inside").read())
    """)
    assert "WROTE" not in result.stdout and "fine" in result.stdout, result
    assert not target.exists() and not Path("/usr/escaped").exists()
    assert not Path("/escaped").exists()


def test_a_fork_bomb_is_contained(any_box: Box) -> None:
    program = (
        "import os\nopen('/tmp/bomb', 'w').close()\nwhile True:\n    try:\n        os.fork()\n"
        "    except OSError:\n        pass\n"
    )
    result = any_box.run(program, limits=SandboxLimits(timeout_s=1.5, max_processes=16))
    assert result.status in (ExecStatus.TIMEOUT, ExecStatus.FAILED, ExecStatus.ERROR), result
    assert any_box.leftovers("bomb") == []


def test_a_memory_bomb_is_contained(any_box: Box) -> None:
    limits = SandboxLimits(timeout_s=10, memory_mb=128)
    result = any_box.run("x = bytearray(16 * 2**30)\n", limits=limits)  # refused at once
    assert result.status == unproven_memory(result.backend, result.enforcement), result
    grow = "blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 20))\n    blocks[-1][::4096] = b'x' * 256\n"
    result = any_box.run(grow, TESTS, "add", limits=limits)
    assert result.status == ExecStatus.MEMORY_EXCEEDED, result


def test_a_cpu_spin_times_out_and_leaves_nothing(any_box: Box) -> None:
    program = (
        "import threading\nopen('/tmp/spin', 'w').close()\ndef spin():\n    while True:\n"
        "        pass\nfor _ in range(4):\n    threading.Thread(target=spin).start()\nspin()\n"
    )
    result = any_box.run(program, limits=SandboxLimits(timeout_s=1.5))
    assert result.status == ExecStatus.TIMEOUT, result
    assert any_box.leftovers("spin") == []


def test_an_output_flood_is_capped(any_box: Box) -> None:
    program = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n    sys.stderr.write('y' * 65536)\n"
    result = any_box.run(program, limits=SandboxLimits(timeout_s=2, output_bytes=4096))
    assert result.status == ExecStatus.TIMEOUT and result.truncated, result
    assert len(result.stdout) <= 4096 and len(result.stderr) <= 4096


def test_an_orphaned_daemon_does_not_survive(any_box: Box) -> None:
    program = (
        "import os, time\nopen('/tmp/daemon', 'w').close()\nif os.fork() == 0:\n    os.setsid()\n"
        "    if os.fork() == 0:\n        time.sleep(1000)\n    os._exit(0)\nprint('parent done')\n"
    )
    result = any_box.run(program)
    assert result.status == ExecStatus.PASSED and "parent done" in result.stdout, result
    assert any_box.leftovers("daemon") == []


def test_cannot_fill_the_disk(any_box: Box) -> None:
    program = (
        "with open('/tmp/big', 'wb') as f:\n    while True:\n        f.write(b'x' * (1 << 20))\n"
    )
    limits = SandboxLimits(timeout_s=10, tmpfs_mb=8, file_size_mb=64)
    result = any_box.run(program, limits=limits)
    assert result.status == ExecStatus.ERROR, result
    assert "No space left" in result.stderr or "File too large" in result.stderr, result
