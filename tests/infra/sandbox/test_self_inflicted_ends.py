"""A program's own end must stay its own: the candidate's seccomp filter (`confine.py`) refuses
the system calls that let a pid namespace's init die of a SIGKILL it caused itself (ptrace, and
a SIGKILL sent to itself as if from the kernel), and the reapers (`zygote.py`,
`pod_launcher.py`) forward only real ends, never the stop a tracer's wait reports.

Each probe runs in a fresh interpreter (a subprocess), so no filter or reaped child touches the
test process. Needs neither root nor bwrap: no_new_privs lets any process install a filter.
test_adversarial.py runs the same tricks as whole programs against the real sandboxes.
"""

from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys

import pytest

from tests.paths import REPO_ROOT

LOAD = r"""
import importlib.util, sys


def load(name):  # the module alone, as the zygote loads it: the package's imports are not needed
    spec = importlib.util.spec_from_file_location(name, f"{sys.argv[1]}/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
"""

PROBES = r"""
import ctypes, json, os, platform, signal, time
confine = load("confine")

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {  # numbers from the kernel's tables, not from confine.py
    "x86_64": {"ptrace": 101, "rt_sigqueueinfo": 129, "rt_tgsigqueueinfo": 297, "unshare": 272,
               "add_key": 248, "request_key": 249, "keyctl": 250},
    "aarch64": {"ptrace": 117, "rt_sigqueueinfo": 138, "rt_tgsigqueueinfo": 240, "unshare": 97,
                "add_key": 217, "request_key": 218, "keyctl": 219},
}[platform.machine()]
KEY_SPEC_USER_KEYRING, KEYCTL_GET_KEYRING_ID = -4, 0
PIDFD_SEND_SIGNAL, SI_KERNEL, SI_QUEUE = 424, 0x80, -1
HIGH_ONLY = ctypes.c_void_p(1 << 32)  # a pointer whose low word is 0


def info(sig, code):
    return (ctypes.c_int * 32)(sig, 0, code)


def sleeper():
    pid = os.fork()
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    return pid


def attempt(call):
    # In a child: its exit code is the errno of the call (0: it returned); -9: it was killed.
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        ctypes.set_errno(0)
        os._exit(ctypes.get_errno() if call(os.getpid()) < 0 else 0)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def kill_a_child(_):
    child = sleeper()
    result = libc.syscall(PIDFD_SEND_SIGNAL, os.pidfd_open(child), 9, None, 0)
    os.waitpid(child, 0)
    return result


if libc.prctl(confine.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "no_new_privs")
buffer, fprog = confine._fprog(confine._seccomp_program())
if libc.prctl(confine.PR_SET_SECCOMP, confine.SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0):
    raise OSError(ctypes.get_errno(), "seccomp")
target = sleeper()
print(json.dumps({
    "ptrace TRACEME": attempt(lambda pid: libc.syscall(NR["ptrace"], 0, 0, 0, 0)),
    "ptrace ATTACH": attempt(lambda pid: libc.syscall(NR["ptrace"], 16, target, 0, 0)),
    "rt_sigqueueinfo SIGKILL": attempt(
        lambda pid: libc.syscall(NR["rt_sigqueueinfo"], pid, 9, info(9, SI_KERNEL))
    ),
    "rt_sigqueueinfo SIGKILL, a high word set": attempt(
        lambda pid: libc.syscall(NR["rt_sigqueueinfo"], pid, 9 | 1 << 32, info(9, SI_KERNEL))
    ),
    "rt_tgsigqueueinfo SIGKILL": attempt(
        lambda pid: libc.syscall(NR["rt_tgsigqueueinfo"], pid, pid, 9, info(9, SI_KERNEL))
    ),
    "pidfd_send_signal SIGKILL with a siginfo": attempt(
        lambda pid: libc.syscall(PIDFD_SEND_SIGNAL, os.pidfd_open(pid), 9, info(9, SI_KERNEL), 0)
    ),
    "pidfd_send_signal SIGKILL, a siginfo above 4 GiB": attempt(
        lambda pid: libc.syscall(PIDFD_SEND_SIGNAL, os.pidfd_open(pid), 9, HIGH_ONLY, 0)
    ),
    "unshare CLONE_NEWUSER": attempt(lambda pid: libc.syscall(NR["unshare"], 0x10000000)),
    "add_key to the uid's keyring": attempt(
        lambda pid: libc.syscall(NR["add_key"], b"user", b"kept", b"secret", 6, KEY_SPEC_USER_KEYRING)
    ),
    "request_key": attempt(lambda pid: libc.syscall(NR["request_key"], b"user", b"kept", None, 0)),
    "keyctl": attempt(
        lambda pid: libc.syscall(NR["keyctl"], KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 0)
    ),
    "io_uring_setup": attempt(lambda pid: libc.syscall(425, 8, (ctypes.c_char * 120)())),
    "rt_sigqueueinfo SIGUSR1": attempt(
        lambda pid: libc.syscall(NR["rt_sigqueueinfo"], pid, 10, info(10, SI_QUEUE))
    ),
    "pidfd_send_signal SIGKILL to a child": attempt(kill_a_child),
}))
os.kill(target, 9)
"""

REAPERS = r"""
import ctypes, json, os, signal
pod_launcher, zygote = load("pod_launcher"), load("zygote")

libc = ctypes.CDLL(None, use_errno=True)


def stopped_tracee():
    # A child that made this process its tracer and stopped: wait4 reports the stop.
    pid = os.fork()
    if pid == 0:
        libc.ptrace(0, 0, None, None)  # PTRACE_TRACEME
        os.kill(os.getpid(), signal.SIGUSR1)
        os._exit(3)
    if os.waitid(os.P_PID, pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT).si_code != os.CLD_TRAPPED:
        print(json.dumps("no ptrace here"))
        raise SystemExit
    return pid


def killed(pid):
    os.kill(pid, signal.SIGKILL)
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # dead, and still to be reaped


seen = {}
pid, sent = stopped_tracee(), []
children = {pid: "run"}
zygote._reap(children, sent.append)
seen["zygote, stopped"] = [[message[:3] for message in sent], list(children.values())]
killed(pid)
zygote._reap(children, sent.append)
seen["zygote, killed"] = [[message[:3] for message in sent], list(children.values())]
pid, exits = stopped_tracee(), {}
pod_launcher.reap(exits)
seen["pod launcher, stopped"] = [status for status, _ in exits.values()]
killed(pid)
pod_launcher.reap(exits)
seen["pod launcher, killed"] = [status for status, _ in exits.values()]
print(json.dumps(seen))
"""


def run_alone(script: str) -> object:
    """The last line of `script`'s output (JSON), run with `LOAD` in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-S", "-I", "-c", LOAD + script, str(REPO_ROOT / "infra" / "sandbox")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout.splitlines()[-1])


def test_the_filter_refuses_what_would_fake_a_kill_from_outside() -> None:
    results = run_alone(PROBES)
    assert results == {
        "ptrace TRACEME": errno.EPERM,
        "ptrace ATTACH": errno.EPERM,
        "rt_sigqueueinfo SIGKILL": errno.EPERM,
        "rt_sigqueueinfo SIGKILL, a high word set": errno.EPERM,
        "rt_tgsigqueueinfo SIGKILL": errno.EPERM,
        "pidfd_send_signal SIGKILL with a siginfo": errno.EPERM,
        "pidfd_send_signal SIGKILL, a siginfo above 4 GiB": errno.EPERM,
        "unshare CLONE_NEWUSER": errno.EPERM,
        # the kernel's keyrings are per uid, not per namespace: a key would outlive the run
        "add_key to the uid's keyring": errno.EPERM,
        "request_key": errno.EPERM,
        "keyctl": errno.EPERM,
        "io_uring_setup": errno.EPERM,  # the widest kernel surface left (Docker refuses it)
        "rt_sigqueueinfo SIGUSR1": 0,  # other signals, and a plain SIGKILL, still work
        "pidfd_send_signal SIGKILL to a child": 0,
    }


def test_the_reapers_forward_ends_not_stops() -> None:
    seen = run_alone(REAPERS)
    if seen == "no ptrace here":
        pytest.skip("this host refuses PTRACE_TRACEME")
    assert seen == {
        "zygote, stopped": [[], ["run"]],  # the child still runs: nothing is sent, nor forgotten
        "zygote, killed": [[["exited", "run", signal.SIGKILL]], []],
        "pod launcher, stopped": [],
        "pod launcher, killed": [signal.SIGKILL],
    }
