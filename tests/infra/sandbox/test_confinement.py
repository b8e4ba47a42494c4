"""The local backend's candidate sandbox and lifecycle against real bwrap and zygotes: what
the candidate can see, isolation between runs, concurrency, cleanup, and platform faults (a
kill from outside, a dead zygote) told apart from the program's own end."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import psutil
import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.cgroups import CGROUP_ROOT, Cgroups
from infra.sandbox.forkserver import ForkServer
from infra.sandbox.verifier import _TAKEN_SLOTS, Verifier
from tests.infra.sandbox.verifier_box import FAST, Box, candidate_processes, needs_root

pytestmark = needs_root

ADD = "def add(a, b):\n    return a + b\n"
CHECK = "def check(candidate):\n    assert candidate(2, 3) == 5\n"


def test_the_candidate_is_confined(box: Box) -> None:
    program = """
        import ctypes, os, socket
        libc = ctypes.CDLL(None, use_errno=True)
        status = open("/proc/self/status").read()
        print("pid", os.getpid(), "uid", os.getuid(), "host", socket.gethostname())
        print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
        print("tmp", os.listdir("/tmp"), "root", sorted(os.listdir("/")))
        print("caps", [l.split()[1] for l in status.splitlines() if l.startswith(("CapEff", "CapBnd"))])
        print("seccomp", [l.split()[1] for l in status.splitlines() if l.startswith("Seccomp:")])
        print("userns", libc.unshare(0x10000000), ctypes.get_errno())
        try:
            socket.create_connection(("1.1.1.1", 53), timeout=1)
            print("NETWORK")
        except OSError:
            print("no network")
        print("fds", sorted(int(fd) for fd in os.listdir("/proc/self/fd")))
    """
    result = box.run(program)
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert result.status == ExecStatus.PASSED, result
    uid = int(lines["pid"].split()[2])
    assert lines["pid"].startswith("1 uid") and uid > 100_000 and "sandbox" in lines["pid"]
    assert lines["pids"] == "[1]" and lines["tmp"].startswith("[] root")
    assert (
        lines["caps"] == "['0000000000000000', '0000000000000000']" and lines["seccomp"] == "['2']"
    )
    assert lines["userns"] == "-1 1" and "no" in lines and "NETWORK" not in result.stdout
    assert lines["fds"] == "[0, 1, 2, 3, 4, 5]"  # 5: the listdir itself


def test_runs_share_no_files(box: Box) -> None:
    writer = "open('/tmp/left', 'w').write('x')\nopen('/dev/shm/left', 'w').write('x')\n"
    assert box.run(writer).status == ExecStatus.PASSED
    reader = "import os\nprint(os.path.exists('/tmp/left'), os.path.exists('/dev/shm/left'))\n"
    assert box.run(reader).stdout == "False False\n"


def test_concurrent_runs_keep_their_own_verdicts(box: Box) -> None:
    wrong = "def add(a, b):\n    return a - b\n"

    async def many() -> list[ExecStatus]:
        runs = [box.run_async(ADD if i % 2 else wrong, CHECK, "add") for i in range(12)]
        return [result.status for result in await asyncio.gather(*runs)]

    statuses = box.loop.run_until_complete(many())
    assert statuses == [ExecStatus.FAILED, ExecStatus.PASSED] * 6


def test_a_candidate_killed_from_outside_is_a_platform_fault(box: Box) -> None:
    program = "import time\nopen('/tmp/victim', 'w').close()\ndef add(a, b):\n    time.sleep(30)\n"

    async def kill_mid_run() -> None:
        run = asyncio.ensure_future(
            box.run_async(program, CHECK, "add", limits=SandboxLimits(timeout_s=20))
        )
        for _ in range(400):
            victims = [
                p for p in candidate_processes() if Path(f"/proc/{p.pid}/root/tmp/victim").exists()
            ]
            if victims:
                await asyncio.sleep(0.2)
                os.kill(victims[0].pid, signal.SIGKILL)  # as the global OOM killer would
                break
            await asyncio.sleep(0.02)
        await run

    with pytest.raises(SandboxInfraError, match="killed from outside"):
        box.loop.run_until_complete(kill_mid_run())


def test_nothing_outlives_its_run(box: Box) -> None:
    daemon = "import os, time\nopen('/tmp/mine', 'w').close()\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(100)\n"
    assert box.run(daemon + ADD, CHECK, "add").status == ExecStatus.PASSED
    box.settle()
    assert [p for p in candidate_processes() if Path(f"/proc/{p.pid}/root/tmp/mine").exists()] == []
    warm = {f"{os.getpid()}-{pair.slot}" for pool in box.verifier._pool.values() for pair in pool}
    for _ in range(50):  # released runs remove their cgroups in the background
        cgroups = {
            path.name for path in (CGROUP_ROOT / "memory" / "tempered").glob(f"{os.getpid()}-*")
        }
        if cgroups <= warm:  # only the warm pairs' are left (their runs have not begun)
            break
        box.settle()
    assert cgroups <= warm


def test_the_first_runs_start_one_pair_of_zygotes_together() -> None:
    own = Box(warm=0)
    try:

        async def first_runs() -> list[ExecStatus]:
            runs = (own.run_async(ADD, CHECK, "add") for _ in range(3))
            return [result.status for result in await asyncio.gather(*runs)]

        assert own.loop.run_until_complete(first_runs()) == [ExecStatus.PASSED] * 3
    finally:
        own.close()


def test_the_warm_pool_serves_runs_and_keeps_its_size() -> None:
    own = Box(warm=2)
    try:
        assert own.run(ADD, CHECK, "add").status == ExecStatus.PASSED
        for _ in range(2):
            own.settle()
            pool = list(own.verifier._pool[FAST.tmpfs_mb])
            assert len(pool) == 2 and not own.verifier._fills
            assert own.run(ADD, CHECK, "add").status == ExecStatus.PASSED
            assert pool[0] in own.verifier._pool[FAST.tmpfs_mb]  # a live pair, still waiting
            assert pool[1] not in own.verifier._pool[FAST.tmpfs_mb]  # the one that served
    finally:
        own.close()


@pytest.mark.skipif(not Cgroups.available(), reason="needs cgroup v1 controllers")
def test_a_dead_workers_cgroups_are_swept_when_the_zygotes_start() -> None:
    gone = psutil.Popen(["true"])
    gone.wait()
    tempered = CGROUP_ROOT / "memory" / "tempered"
    dead, alive = tempered / f"{gone.pid}-5", tempered / "1-5"  # pid 1 lives
    (dead / "inner").mkdir(parents=True)  # runsc makes a group of its own below a run's
    alive.mkdir()
    left = psutil.Popen(["sleep", "60"])  # what a candidate of the dead worker left running
    (dead / "inner" / "cgroup.procs").write_text(str(left.pid))
    own = Box(warm=0)
    try:
        assert own.run(ADD, CHECK, "add").status == ExecStatus.PASSED
        assert not dead.exists() and alive.exists()
        assert left.wait(5) == -9
    finally:
        own.close()
        alive.rmdir()
        if left.poll() is None:
            left.kill()


@pytest.mark.parametrize("slots", [range(0, 4), range(8000, 8193)])
def test_uid_slots_outside_the_workers_range_are_refused(slots: range) -> None:
    launcher = ForkServer("candidate", ["/bin/true"])  # never started
    with pytest.raises(ValueError, match="1..8191"):
        Verifier(launcher, slots=slots)
    assert Verifier(launcher, slots=range(1, 8192)).slots == range(1, 8192)


def test_closing_the_verifier_stops_everything_it_started() -> None:
    before = {p.pid for p in candidate_processes()}
    held_before = set(_TAKEN_SLOTS)
    own = Box()
    try:
        assert own.run(ADD, CHECK, "add").status == ExecStatus.PASSED
        own.settle()
        held = set(_TAKEN_SLOTS) - held_before  # the warm pairs' uid slots
        started = {p.pid for p in candidate_processes()} - before
        servers = [own.verifier._checker, own.verifier.launcher]
        processes = [server.process for server in servers if isinstance(server, ForkServer)]
        zygotes = [process.pid for process in processes if process is not None]
        assert started and len(zygotes) == 2  # the warm pairs' candidates, the two zygotes
    finally:
        own.close()
    assert not any(psutil.pid_exists(pid) for pid in started | set(zygotes))
    assert held and not held & _TAKEN_SLOTS  # every uid slot it held is free again


def test_a_dead_zygote_is_a_platform_fault_and_is_replaced() -> None:
    own = Box()
    try:
        assert own.run(ADD, CHECK, "add").status == ExecStatus.PASSED
        launcher = own.backend.verifier.launcher
        assert isinstance(launcher, ForkServer) and launcher.process is not None
        zygote = psutil.Process(launcher.process.pid)

        async def kill_zygote_mid_run() -> None:
            run = asyncio.ensure_future(
                own.run_async("import time\ndef add(a, b):\n    time.sleep(30)\n", CHECK, "add")
            )
            await asyncio.sleep(0.5)
            for proc in zygote.children(recursive=True):
                if proc.name() == "python3" and proc.uids().real == 0:
                    proc.kill()  # the zygote itself (its children are not root)
                    break
            await run

        with pytest.raises(SandboxInfraError, match="zygote"):
            own.loop.run_until_complete(kill_zygote_mid_run())
        assert own.run(ADD, CHECK, "add").status == ExecStatus.PASSED  # a new zygote serves
    finally:
        own.close()
