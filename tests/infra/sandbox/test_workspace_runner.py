"""Commands over a workspace (infra/sandbox/workspace.py), on real bwrap and cgroups: the
workspace is read-write at its workdir and nothing else of the host is, every limit holds,
there is no network, and nothing is left behind (processes, cgroups). The start-up probe
(`CommandRunner.probe`, infra/sandbox/probe.py) passes here, in cgroups as a step's; reports
what bwrap (or setpriv) said where the sandbox cannot come up for a reason no retry mends; and
condemns nothing for a resource shortage (tried again a second later) or a sandbox that does
not answer in time."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.cgroups import CGROUP_ROOT, Cgroups, sweep_dead_workers
from infra.sandbox.workspace import (
    SESSION_UID_BASE,
    SLOTS,
    CommandRunner,
    Mounts,
    cgroup_name,
    check_mount_point,
    session_uid,
)
from infra.sandbox.workspace_result import cpu_killed
from tests.infra.sandbox.argv_faults import alter_argv, fail_with, nproc_one, reject_option

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bwrap and root"
)
SLOT = 7
LIMITS = SandboxLimits(
    timeout_s=5, max_processes=16, output_bytes=1000, file_size_mb=1, memory_mb=64
)


@pytest.fixture
def workspace() -> Iterator[Path]:
    parent = Path(tempfile.mkdtemp(prefix="tempered-test-runner-"))
    parent.chmod(0o711)
    ws = parent / "ws"
    ws.mkdir(mode=0o700)
    os.chown(ws, session_uid(SLOT), session_uid(SLOT))
    (ws / "hello.txt").write_text("hello\n")
    yield ws
    shutil.rmtree(parent)


def run(workspace: Path, command: str, limits: SandboxLimits = LIMITS, **mounts: object):  # type: ignore[no-untyped-def]
    runner = CommandRunner()
    spec = Mounts(workspace, **mounts)  # type: ignore[arg-type]
    return asyncio.run(runner.run(command, spec, session_uid(SLOT), limits, cgroup_name(SLOT)))


def test_a_command_sees_its_workspace_at_the_workdir_and_writes_only_there(workspace: Path) -> None:
    result = run(
        workspace,
        "pwd; cat hello.txt; echo $GREETING > out.txt; id -u; touch /usr/x",
        workdir="/srv/app",
        env={"GREETING": "hi"},
    )
    assert result.status is ExecStatus.FAILED and result.exit_code == 1  # `touch /usr/x` failed
    assert result.stdout.splitlines() == ["/srv/app", "hello", "1000"]
    assert "Read-only file system" in result.stderr
    assert (workspace / "out.txt").read_text() == "hi\n"
    assert (workspace / "out.txt").stat().st_uid == session_uid(SLOT)


def test_exit_codes_and_the_deadline(workspace: Path) -> None:
    assert run(workspace, "exit 3").exit_code == 3
    assert run(workspace, "true").status is ExecStatus.PASSED
    slow = run(workspace, "sleep 30 & sleep 30", LIMITS.model_copy(update={"timeout_s": 1}))
    assert slow.status is ExecStatus.TIMEOUT and "deadline" in slow.detail
    assert slow.duration_ms < 5000


def test_no_network_and_no_host_files(workspace: Path) -> None:
    result = run(
        workspace,
        "cat /etc/shadow; ls /root; python3 -c 'import socket; socket.create_connection((\"1.1.1.1\", 53), 1)'",
    )
    assert result.status is ExecStatus.FAILED
    assert "No such file" in result.stderr and "Network is unreachable" in result.stderr


def test_memory_processes_output_and_file_size_are_limited(workspace: Path) -> None:
    memory = run(workspace, "python3 -c 'x = bytearray(300 << 20)'")
    assert memory.status is ExecStatus.MEMORY_EXCEEDED
    forks = run(
        workspace,
        "for i in $(seq 40); do sleep 5 & done; wait",
        LIMITS.model_copy(update={"timeout_s": 3}),
    )
    assert "fork" in forks.stderr.lower() or "resource" in forks.stderr.lower()
    loud = run(workspace, "yes | head -c 100000")
    assert loud.truncated and len(loud.stdout) == LIMITS.output_bytes
    big = run(workspace, "head -c 3000000 /dev/zero > big.bin")
    assert big.status is ExecStatus.FAILED and (workspace / "big.bin").stat().st_size <= 1 << 20


@pytest.mark.parametrize("hog", ["while :; do :; done", "exec python3 -c 'while True: pass'"])
def test_the_cpu_limit_is_a_timeout_even_for_the_commands_own_shell(
    workspace: Path, hog: str
) -> None:
    limits = LIMITS.model_copy(update={"cpu_s": 1, "timeout_s": 10})
    result = run(workspace, hog, limits)
    assert (result.status, result.detail) == (ExecStatus.TIMEOUT, "CPU limit of 1s"), result
    assert result.duration_ms < 5000


def test_the_process_and_file_size_limits_hold_to_the_unit(workspace: Path) -> None:
    """`max_processes` counts the command's shell and everything it starts; `file_size_mb` is
    the largest file it may write, to the byte."""
    many = "for i in $(seq {}); do sleep 0.3 & done; wait"
    assert run(workspace, many.format(LIMITS.max_processes - 1)).status is ExecStatus.PASSED
    over = run(workspace, many.format(LIMITS.max_processes))
    assert over.status is ExecStatus.FAILED and "fork" in over.stderr.lower()
    size = LIMITS.file_size_mb << 20
    assert run(workspace, f"head -c {size} /dev/zero > max.bin").status is ExecStatus.PASSED
    assert (workspace / "max.bin").stat().st_size == size
    over = run(workspace, f"head -c {size + 1} /dev/zero > over.bin")
    assert over.status is ExecStatus.FAILED and (workspace / "over.bin").stat().st_size == size


def test_a_mount_the_host_cannot_make_is_a_platform_fault(workspace: Path) -> None:
    with pytest.raises(SandboxInfraError, match="failed to set up: bwrap: Can't find source"):
        run(workspace, "true", extra=((Path("/nonexistent/tempered"), "/data", False),))


def test_a_sandbox_that_cannot_be_launched_leaves_no_descriptor_open(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`argv` refusing (no bwrap on this host) left the status pipe's read end open, one
    descriptor a command for as long as the worker lived."""

    def no_bwrap(*_: object) -> list[str]:
        raise SandboxInfraError("bwrap is not installed")

    monkeypatch.setattr(CommandRunner, "argv", no_bwrap)
    gc.collect()  # an earlier test's garbage closing a descriptor meanwhile read as 38 == 39
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(SandboxInfraError, match="not installed"):
            run(workspace, "true")
    assert len(os.listdir("/proc/self/fd")) == before


def test_session_uids_never_overlap_between_workers_or_slots() -> None:
    """A dead worker's uids are swept by range: no uid of a live worker may lie in it."""
    pids = (99, 100, 101)
    uids = [session_uid(slot, pid) for pid in pids for slot in range(SLOTS)]
    assert len(set(uids)) == len(uids)
    assert (min(uids), max(uids)) == (
        SESSION_UID_BASE + 99 * SLOTS,
        SESSION_UID_BASE + 102 * SLOTS - 1,
    )
    for slot in (-1, SLOTS):
        with pytest.raises(ValueError, match=f"outside 0..{SLOTS - 1}"):
            session_uid(slot)
    assert cgroup_name(3, pid=99) == "99-w3" and cgroup_name(3) == f"{os.getpid()}-w3"


@pytest.mark.skipif(not Cgroups.available(), reason="needs cgroup v1 controllers")
def test_a_dead_workers_command_cgroups_are_swept_with_what_runs_in_them() -> None:
    gone = psutil.Popen(["true"])
    gone.wait()
    cgroups = Cgroups.create(cgroup_name(3, pid=gone.pid))
    left = psutil.Popen(["sleep", "60"])  # what a command of the dead worker left running
    try:
        for procs in cgroups.procs_files():
            procs.write_text(str(left.pid))
        assert sweep_dead_workers(gone.pid) == 1
        assert left.wait(5) == -9
        assert not any(path.exists() for path in cgroups.paths.values())
        assert sweep_dead_workers(gone.pid) == 0
    finally:
        if left.poll() is None:
            left.kill()


def test_nothing_is_left_behind(workspace: Path) -> None:
    run(workspace, "sleep 60 & sleep 60 & echo started", LIMITS.model_copy(update={"timeout_s": 1}))
    uid = session_uid(SLOT)
    assert not [
        p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid
    ]
    if Cgroups.available():
        assert not any(
            (CGROUP_ROOT / ctl / "tempered" / cgroup_name(SLOT)).exists()
            for ctl in ("memory", "pids")
        )


@pytest.mark.parametrize("path", ["/", "/usr/lib", "/proc/x", "relative", "/app/../etc"])
def test_mount_points_inside_the_system_are_refused(path: str) -> None:
    with pytest.raises(ValueError):
        check_mount_point(path)


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The pauses of half a second or more asked of `time.sleep` (not taken); shorter ones
    (subprocess's own polling) are slept."""
    asked: list[float] = []
    sleep = time.sleep

    def record(seconds: float) -> None:
        if seconds >= 0.5:
            asked.append(seconds)
        else:
            sleep(seconds)

    monkeypatch.setattr(time, "sleep", record)
    return asked


def test_the_probe_passes_where_sandboxes_come_up(pauses: list[float]) -> None:
    assert CommandRunner().probe() == "" and not pauses


def test_the_probe_reports_bwraps_own_error_once_it_failed_twice(
    monkeypatch: pytest.MonkeyPatch, pauses: list[float]
) -> None:
    asked = alter_argv(monkeypatch, reject_option, tries=2)
    why = CommandRunner().probe()
    assert asked == ["true"] * 2  # the steps' own sandbox (argv), for `true`
    assert why.startswith("no workspace sandbox comes up on this host: bwrap: Unknown option")
    assert "--no-such-option" in why and "\n" not in why  # bwrap's text, on one line
    assert "user namespaces" in why  # what to look at
    assert not pauses  # a definitive error is tried again at once


def test_a_probe_that_fails_once_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = alter_argv(monkeypatch, reject_option, tries=1)
    assert CommandRunner().probe() == "" and len(asked) == 2


@pytest.mark.parametrize(
    "script",
    [
        "echo 'bwrap: No permissions to creating new namespace, likely because the kernel "
        "does not allow non-privileged user namespaces.' >&2; exit 1",
        "echo 'bwrap: Creating new namespace failed: Operation not permitted' >&2; exit 1",
        "echo 'setpriv: setresuid failed: Operation not permitted' >&2; exit 127",
        "kill -SYS $$",  # a seccomp profile that kills
    ],
    ids=["userns-disabled", "eperm", "setpriv-eperm", "sigsys"],
)
def test_a_fault_no_retry_mends_condemns_the_host(
    monkeypatch: pytest.MonkeyPatch, script: str
) -> None:
    alter_argv(monkeypatch, fail_with(script), tries=2)
    why = CommandRunner().probe()
    assert why.startswith("no workspace sandbox comes up on this host: "), why
    if "SYS" in script:
        assert "killed by SIGSYS: Bad system call" in why


@pytest.mark.parametrize(
    "error",
    [
        "bwrap: Creating new namespace failed: No space left on device",  # user namespaces
        "bwrap: Creating new namespace failed: Resource temporarily unavailable",
        "bwrap: Creating new namespace failed: Cannot allocate memory",
    ],
    ids=["enospc", "eagain", "enomem"],
)
def test_a_resource_shortage_condemns_nothing(
    monkeypatch: pytest.MonkeyPatch,
    pauses: list[float],
    caplog: pytest.LogCaptureFixture,
    error: str,
) -> None:
    """user.max_user_namespaces used up by neighbours' sessions, a pids limit, memory: the
    host is healthy once they end; the worker serves and a step would be retried."""
    asked = alter_argv(monkeypatch, fail_with(f"echo '{error}' >&2; exit 1"), tries=2)
    with caplog.at_level(logging.WARNING):
        assert CommandRunner().probe() == ""
    assert len(asked) == 2 and pauses == [1.0]  # the second try came a second later
    assert f"without a verdict ({error}; {error}); serving sessions" in caplog.text


def test_a_real_process_shortage_condemns_nothing(
    monkeypatch: pytest.MonkeyPatch, pauses: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    asked = alter_argv(monkeypatch, nproc_one, tries=2)
    with caplog.at_level(logging.WARNING):
        assert CommandRunner().probe() == ""
    assert len(asked) == 2 and pauses == [1.0]
    assert "Creating new namespace failed: Resource temporarily unavailable" in caplog.text


def test_a_shortage_that_passes_is_waited_out(
    monkeypatch: pytest.MonkeyPatch, pauses: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    asked = alter_argv(monkeypatch, nproc_one, tries=1)
    with caplog.at_level(logging.WARNING):
        assert CommandRunner().probe() == ""
    assert len(asked) == 2 and pauses == [1.0] and not caplog.text  # then it came up


def test_the_probe_runs_in_cgroups_and_removes_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a step: its sandbox joins cgroups of its slot's name, which are gone afterwards."""
    runner = CommandRunner()
    if not runner.use_cgroups:
        pytest.skip("needs cgroups")
    made: list[Cgroups] = []
    peaks: list[int] = []
    create, reap = Cgroups.create.__func__, Cgroups.reap  # type: ignore[attr-defined]

    def created(cls: type[Cgroups], name: str) -> Cgroups:
        made.append(create(cls, name))
        return made[-1]

    async def reaped(self: Cgroups, *args: Any) -> bool:
        peaks.append(int((self.paths["memory"] / "memory.max_usage_in_bytes").read_text()))
        return bool(await reap(self, *args))

    monkeypatch.setattr(Cgroups, "create", classmethod(created))
    monkeypatch.setattr(Cgroups, "reap", reaped)
    assert runner.probe() == ""
    assert [group.name for group in made] == [cgroup_name(SLOTS - 1)]
    assert peaks[0] > 0  # the sandbox's processes were charged to it
    assert not [path for path in made[0].paths.values() if path.exists()]


def test_a_probe_without_an_answer_condemns_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A sandbox that does not come up in time (a loaded host) is killed, tried once more,
    and the host is not judged: a slow worker must not refuse sessions for ever."""
    hang = ["/bin/sh", "-c", "exec sleep 30.25"]
    monkeypatch.setattr(CommandRunner, "argv", lambda self, *args: hang)
    with caplog.at_level(logging.WARNING):
        assert CommandRunner().probe(timeout_s=0.3) == ""
    assert "(no answer in 0.3s; no answer in 0.3s); serving sessions" in caplog.text
    left = [p for p in psutil.process_iter(["cmdline"]) if "30.25" in (p.info["cmdline"] or [])]
    assert not left  # each try's sandbox was killed


@pytest.mark.parametrize(
    ("bounding", "said"),
    [("-all", "cannot prepare its workspace: [Errno 1] Operation not permitted"),
     ("-all,+chown", "setpriv: setresuid failed: Operation not permitted")],
)  # fmt: skip
def test_a_process_without_capabilities_gets_no_sandbox(bounding: str, said: str) -> None:
    """A real host fault, no fake: a root worker whose capabilities are dropped (a container
    without them) cannot give the workspace to the sandbox uid, nor drop to it, and the
    probe says so in the tool's words."""
    probe = "from infra.sandbox.workspace import CommandRunner; print(CommandRunner().probe())"
    dropped = ["setpriv", f"--bounding-set={bounding}", "--inh-caps=-all", sys.executable]
    run = subprocess.run([*dropped, "-c", probe], capture_output=True, text=True, timeout=60)
    assert run.stdout.startswith(f"no workspace sandbox comes up on this host: {said}"), run


def test_the_rule_condemns_only_faults_no_retry_mends() -> None:
    from infra.sandbox.probe import definitive

    assert definitive("bwrap: Unknown option --disable-userns")
    assert definitive("setpriv: setresuid failed: Operation not permitted")
    assert definitive("bwrap: setting up uid map: Permission denied")
    assert not definitive("bwrap: Creating new namespace failed: No space left on device")
    assert not definitive("setpriv: setresuid failed: Resource temporarily unavailable")
    assert not definitive("cannot start /bin/sh: Cannot allocate memory")
    assert not definitive("bwrap: Can't find source path /x: Permission denied")  # unknown


@pytest.mark.skipif(
    not (Cgroups.available() and Cgroups.cpuacct_available()),
    reason="needs a cpuacct hierarchy of its own: without a count the duration decides",
)
def test_a_slow_commands_own_exit_152_is_no_cpu_kill(workspace: Path) -> None:
    """A command's own `exit 152` (128 + SIGXCPU) after sleeping past `cpu_s` / CPUs seconds read
    as a CPU kill while the runner judged by its duration (its cpuacct group was joined only
    after the command ended, and counted nothing): it is the command's exit, judged by the CPU
    its group counted."""
    limits = LIMITS.model_copy(update={"cpu_s": 1, "timeout_s": 10})
    result = run(workspace, "sleep 1.5; exit 152", limits)
    assert (result.status, result.exit_code) == (ExecStatus.FAILED, 152), result


def test_without_a_count_the_cpu_margin_is_not_given() -> None:
    """`CPU_COUNTED_SHARE` forgives a count that lags the kernel's ticks; a duration × CPUs guess
    (no cpuacct hierarchy of its own) gets no margin: at 80% of `cpu_s` it is no CPU kill."""
    limits = LIMITS.model_copy(update={"cpu_s": 10})
    most = 10_000 // (os.cpu_count() or 1)  # ms that could hold `cpu_s` on every CPU
    assert not cpu_killed(152, limits, None, most * 8 // 10)
    assert cpu_killed(152, limits, None, most + 1)
    assert cpu_killed(152, limits, 8.0, 0)  # counted: within the margin
