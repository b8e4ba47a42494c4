"""The start-up probe (infra/sandbox/probe.py) on hosts that can never run a workspace sandbox
for a reason bwrap reports as a shortage or as an error of no other kind: namespace limits of 0
(`user.max_user_namespaces=0`, RHEL 7's default: bwrap's clone fails ENOSPC) and a read-only
/proc/sys (a container started without the chart's script: --disable-userns fails EROFS). The
real probe runs each time, with its real launcher, setpriv and cgroups; bwrap is a script first
on PATH that says what bwrap says on such a host, and the namespace limits are read from a
directory the test fills. A real read-only /proc/sys, in a mount namespace of its own, runs
the real bwrap."""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infra.sandbox.probe import definitive, probe
from infra.sandbox.workspace import CommandRunner

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or shutil.which("setpriv") is None or os.geteuid() != 0,
    reason="needs bwrap, setpriv and root",
)

ENOSPC_OLD = "bwrap: Creating new namespace failed: No space left on device"
ENOSPC_NEW = (
    "bwrap: Creating new namespace failed: nesting depth or /proc/sys/user/max_*_namespaces "
    "exceeded (ENOSPC)"
)
EROFS_OPEN = "bwrap: cannot open /proc/sys/user/max_user_namespaces: Read-only file system"
EROFS_WRITE = "bwrap: sysctl user.max_user_namespaces = 1: Read-only file system"
VERDICT = "no workspace sandbox comes up on this host: "
NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")


@pytest.fixture
def bwrap_says(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """Put a bwrap first on PATH that prints the given error and exits 1, as bwrap's `die`
    does; the sandbox uid (setpriv drops to it first) may read and run it."""
    folder = Path(tempfile.mkdtemp(prefix="tempered-test-probe-"))
    folder.chmod(0o755)

    def install(error: str) -> None:
        script = folder / "bwrap"
        script.write_text(f"#!/bin/sh\necho {shlex.quote(error)} >&2\nexit 1\n")
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")

    yield install
    shutil.rmtree(folder)


def limits(folder: Path, **values: int) -> Path:
    """A /proc/sys/user of namespace limits: 1000 each, but those given."""
    folder.mkdir()
    for kind in NAMESPACES:
        (folder / f"max_{kind}_namespaces").write_text(f"{values.get(kind, 1000)}\n")
    return folder


@pytest.mark.parametrize("error", [ENOSPC_OLD, ENOSPC_NEW], ids=["older-bwrap", "bwrap-0.8"])
@pytest.mark.parametrize("kind", ["user", "mnt", "cgroup"])
def test_a_namespace_limit_of_0_condemns_the_host_and_is_named(
    bwrap_says: Callable[[str], None], tmp_path: Path, error: str, kind: str
) -> None:
    bwrap_says(error)
    runner = CommandRunner()
    assert runner.bwrap is not None and runner.bwrap.startswith(tempfile.gettempdir())
    why = probe(runner, limits=limits(tmp_path / "user", **{kind: 0}), pause_s=0)
    assert why.startswith(f"{VERDICT}{error} (user.max_{kind}_namespaces is 0 on this host)")
    assert "\n" not in why


def test_every_limit_of_0_is_named(bwrap_says: Callable[[str], None], tmp_path: Path) -> None:
    bwrap_says(ENOSPC_OLD)
    why = probe(CommandRunner(), limits=limits(tmp_path / "user", user=0, net=0), pause_s=0)
    assert (
        f"{ENOSPC_OLD} (user.max_user_namespaces is 0 on this host, "
        "user.max_net_namespaces is 0 on this host)"
    ) in why


@pytest.mark.parametrize("error", [ENOSPC_OLD, ENOSPC_NEW], ids=["older-bwrap", "bwrap-0.8"])
def test_namespaces_used_up_condemn_nothing(
    bwrap_says: Callable[[str], None],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    error: str,
) -> None:
    """Limits above 0: a count neighbours' sessions used up, which may pass; no verdict."""
    bwrap_says(error)
    folder = limits(tmp_path / "user")
    (folder / "max_cgroup_namespaces").unlink()  # a kernel without the limit: none read
    (folder / "max_ipc_namespaces").write_text("")  # nor one that cannot be read as a number
    with caplog.at_level(logging.WARNING):
        assert probe(CommandRunner(), limits=folder, pause_s=0) == ""
    assert f"without a verdict ({error}; {error}); serving sessions" in caplog.text


@pytest.mark.parametrize("error", [EROFS_OPEN, EROFS_WRITE], ids=["open", "write"])
def test_a_read_only_proc_sys_condemns_the_host(
    bwrap_says: Callable[[str], None], tmp_path: Path, error: str
) -> None:
    bwrap_says(error)
    why = probe(CommandRunner(), limits=limits(tmp_path / "user"), pause_s=0)
    assert why.startswith(f"{VERDICT}{error} (") and "a writable /proc/sys" in why


def test_a_real_read_only_proc_sys_condemns_the_host(tmp_path: Path) -> None:
    """No fake: the real bwrap, in a mount namespace whose /proc/sys is read-only, with a
    whole proc mounted elsewhere (as a container gives bwrap one: the kernel lets a user
    namespace mount proc only where one is fully visible), so bwrap comes as far as
    --disable-userns."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare")
    check = "from infra.sandbox.workspace import CommandRunner; print(CommandRunner().probe())"
    read_only = (
        f"mount -t proc proc {shlex.quote(str(tmp_path))} && mount --bind /proc/sys /proc/sys "
        "&& mount -o remount,bind,ro /proc/sys && "
        f"exec {shlex.quote(sys.executable)} -c {shlex.quote(check)}"
    )
    run = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", read_only],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    if run.returncode != 0 and "mount" in run.stderr and not run.stdout:
        pytest.skip(f"cannot make /proc/sys read-only here: {run.stderr.strip()}")
    assert run.stdout.startswith(f"{VERDICT}{EROFS_OPEN} ("), run


def test_the_rule_reads_a_limit_of_0_only_from_an_enospc(tmp_path: Path) -> None:
    from infra.sandbox.probe import no_namespaces

    folder = limits(tmp_path / "user", user=0)
    assert definitive(no_namespaces(ENOSPC_OLD, folder))
    assert definitive(no_namespaces(ENOSPC_NEW, folder))
    assert not definitive(ENOSPC_OLD) and not definitive(ENOSPC_NEW)  # nothing read: a shortage
    other = "bwrap: Creating new namespace failed: Resource temporarily unavailable"
    assert no_namespaces(other, folder) == other and not definitive(other)
    assert no_namespaces(ENOSPC_OLD, tmp_path / "missing") == ENOSPC_OLD
    assert definitive(EROFS_OPEN) and definitive(EROFS_WRITE)
    assert definitive("cannot prepare its workspace: [Errno 30] Read-only file system: '/x'")
