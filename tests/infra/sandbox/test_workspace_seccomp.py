"""A workspace command's seccomp filter (infra/sandbox/workspace.py, the candidate's program from
confine.py), on real bwrap: a command may not use the kernel's keyrings (kept per uid, and a
session slot's uid serves one episode after another), nor make a user namespace, and clone3 is
ENOSYS (the C library falls back to clone); ptrace still works (debuggers, LeakSanitizer). The
probe is Python over ctypes, with its own system call numbers (not confine.py's)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox import workspace
from infra.sandbox.workspace import CommandRunner, Mounts, cgroup_name, session_uid

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0 or os.uname().machine not in
    ("x86_64", "aarch64"), reason="needs bwrap, root and x86_64 or aarch64",
)  # fmt: skip
SLOT = 5
LIMITS = SandboxLimits(timeout_s=20, max_processes=16, memory_mb=256)
EPERM, ENOSYS = 1, 38
PROBE = r"""
import ctypes, json, os, sys

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
ADD_KEY, REQUEST_KEY, KEYCTL, UNSHARE, CLONE3 = {
    "x86_64": (248, 249, 250, 272, 435), "aarch64": (217, 218, 219, 97, 435)
}[os.uname().machine]
KEY_SPEC_USER_KEYRING, KEYCTL_SETPERM, KEYCTL_READ, CLONE_NEWUSER = -4, 5, 11, 0x10000000
DESCRIPTION = b"tempered-probe"


def errno(*args):
    return 0 if libc.syscall(*args) >= 0 else ctypes.get_errno()


def add_key():
    serial = libc.syscall(ADD_KEY, b"user", DESCRIPTION, b"secret", ctypes.c_size_t(6),
                          ctypes.c_int(KEY_SPEC_USER_KEYRING))
    if serial < 0:
        return ctypes.get_errno()
    return errno(KEYCTL, KEYCTL_SETPERM, ctypes.c_int(serial), ctypes.c_uint(0x3F3F3F3F))


def traced_child():
    pid = os.fork()
    if pid == 0:
        os._exit(0 if libc.ptrace(0, 0, 0, 0) == 0 else ctypes.get_errno())  # PTRACE_TRACEME
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


if sys.argv[1] == "calls":
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    print(json.dumps({
        "seccomp": int(status["Seccomp"]),
        "add_key": add_key(),
        "request_key": errno(REQUEST_KEY, b"user", DESCRIPTION, None, ctypes.c_int(0)),
        "keyctl": errno(KEYCTL, 0, ctypes.c_int(KEY_SPEC_USER_KEYRING), 0),
        "unshare": errno(UNSHARE, ctypes.c_int(CLONE_NEWUSER)),
        "clone3": errno(CLONE3, None, ctypes.c_size_t(0)),
        "ptrace": traced_child(),
    }))
elif sys.argv[1] == "add":
    print(add_key())
else:  # what of a key by that name this uid can see, and read
    found = []
    for line in open("/proc/keys"):
        if DESCRIPTION.decode() in line:
            buffer = ctypes.create_string_buffer(64)
            serial = ctypes.c_int(int(line.split()[0], 16))
            read = libc.syscall(KEYCTL, KEYCTL_READ, serial, buffer, ctypes.c_size_t(64))
            found.append([line.strip(), buffer.value.decode() if read >= 0 else None])
    print(json.dumps(found))
"""


@pytest.fixture
def workspace_dir() -> Iterator[Path]:
    parent = Path(tempfile.mkdtemp(prefix="tempered-test-seccomp-"))
    parent.chmod(0o711)
    ws = parent / "ws"
    ws.mkdir(mode=0o700)
    (ws / "probe.py").write_text(PROBE)
    os.chown(ws, session_uid(SLOT), session_uid(SLOT))
    yield ws
    shutil.rmtree(parent)


def probe(ws: Path, mode: str) -> object:
    runner = CommandRunner()
    command = f"python3 -S probe.py {mode}"
    result = asyncio.run(
        runner.run(command, Mounts(ws), session_uid(SLOT), LIMITS, cgroup_name(SLOT))
    )
    assert result.status is ExecStatus.PASSED, (result.detail, result.stderr)
    return json.loads(result.stdout)


def test_a_command_may_not_use_the_keyrings_nor_make_a_user_namespace(workspace_dir: Path) -> None:
    assert probe(workspace_dir, "calls") == {
        "seccomp": 2,
        "add_key": EPERM,
        "request_key": EPERM,
        "keyctl": EPERM,
        "unshare": EPERM,
        "clone3": ENOSYS,
        "ptrace": 0,
    }


def test_a_key_one_command_adds_is_not_seen_by_the_next_in_its_slot(workspace_dir: Path) -> None:
    """The slot's uid is the next episode's: a key the first left (readable by its uid) would
    be a channel between episodes that must be independent."""
    added, found = probe(workspace_dir, "add"), probe(workspace_dir, "find")
    assert (added, found) == (EPERM, [])


def test_a_host_without_a_filter_for_its_architecture_runs_no_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_filter(allow_ptrace: bool = False) -> bytes:
        raise OSError("confine: no seccomp filter for riscv64")

    monkeypatch.setattr(workspace, "seccomp_filter", no_filter)
    assert CommandRunner().missing == "confine: no seccomp filter for riscv64"
