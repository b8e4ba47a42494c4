"""A confined program reaches none of the kernel's keyrings: they are kept per uid, not per
namespace, so keys outlive a run, and a child keeps its parent's session keyring across a uid
change. `confine.drop_privileges` leaves the worker's session keyring before its filter refuses
keyctl; the filter's rules are probed in test_self_inflicted_ends.py and, for workspace
commands, test_workspace_seccomp.py.

The probe runs in a fresh interpreter as root (a uid change needs it): a worker that joined a
session keyring of its own (as under systemd) and put a key in it, then a child confined as
`Confinement.drop_privileges` confines a Kubernetes candidate, which reads /proc/keys.
"""

from __future__ import annotations

import os

import pytest

from tests.infra.sandbox.test_self_inflicted_ends import run_alone

PROBE = r"""
import ctypes, json, os
confine = load("confine")
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
keyctl, add_key = confine.KEYRING_CALLS[os.uname().machine][2], confine.KEYRING_CALLS[os.uname().machine][0]
KEY_SPEC_SESSION_KEYRING = -3
joined = libc.syscall(keyctl, 1, b"tempered-test-worker-session")  # KEYCTL_JOIN_SESSION_KEYRING
key = libc.syscall(add_key, b"user", b"tempered-test-worker-secret", b"xyz", 3, KEY_SPEC_SESSION_KEYRING)
if joined < 0 or key < 0:
    print(json.dumps({"skip": os.strerror(ctypes.get_errno())}))
    raise SystemExit
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(read)
    confine.Confinement().drop_privileges(65533)
    os.write(write, json.dumps({"seen": "tempered-test-worker" in open("/proc/keys").read()}).encode())
    os._exit(0)
os.close(write)
os.waitpid(pid, 0)
print(os.read(read, 4096).decode())
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a uid change needs root")
def test_a_confined_program_sees_nothing_of_the_workers_session_keyring() -> None:
    seen = run_alone(PROBE)
    assert isinstance(seen, dict)
    if "skip" in seen:
        pytest.skip(f"this host refuses keyrings to the test itself: {seen['skip']}")
    assert seen == {"seen": False}, "the confined child listed the worker's key in /proc/keys"
