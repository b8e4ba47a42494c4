"""Confines a freshly forked candidate process: the per-run half of the candidate sandbox.

The candidate zygote (`zygote.py`) runs as root inside a bubblewrap sandbox that already has a
read-only root (/usr, /bin, /lib*, a read-only /dev with null, zero, full, random, urandom),
no network and its own pid/ipc/uts namespaces. For each run it forks a child with
`PidNamespaces.fork` (pid 1 of a fresh pid namespace), and the child calls
`Confinement.apply(...)` (prepared once in the zygote) before any job exists:

- dies with the zygote (PR_SET_PDEATHSIG), new session, joins the run's cgroups (memory, pids);
- fresh mount, network, ipc, uts and cgroup namespaces; its own /proc (so it sees only its pid
  namespace), a private size-limited tmpfs at /tmp (also bound at /dev/shm), the cgroup file
  systems unmounted, hostname "sandbox";
- every capability dropped (bounding set included), no supplementary groups, the run's own
  uid/gid (no host account owns it, no other process runs under it), no_new_privs;
- a seccomp filter that refuses new user namespaces (like bwrap's --disable-userns), clone3
  (whose flags a filter cannot read; the C library falls back to clone), ptrace, and a SIGKILL
  the program sends itself as if from the kernel (the two would let pid 1 of its namespace die
  of a SIGKILL it caused, which the judge takes for a kill from outside: a platform fault);
  once the run's resource limits are set, a second one that refuses changing them
  (`lock_rlimits`); the kernel's keyrings, kept per uid across runs, and io_uring are refused
  too, and the child leaves the worker's session keyring first. A workspace command's bwrap
  loads the same filter, ptrace let through (`seccomp_filter`).

Every step is checked and a failure raises OSError: the caller exits and the run is reported
as a platform fault, never started half-confined. Kill pid 1 (the candidate) and the kernel
kills every process of the namespace. The Kubernetes pod's launcher uses the second half alone
(`Confinement.drop_privileges`: uid, capabilities, groups, no_new_privs, seccomp, verified),
as a pod has no namespaces to make, with one more rule: since the pod's candidate shares the
pod's network, its filter refuses every socket family but AF_UNIX (`unix_sockets_only`).
Stdlib only (loaded by `zygote.py` and `pod_launcher.py`).

Not covered: architectures other than x86_64 and aarch64 (refused), CPU isolation (RLIMIT_CPU
and the host's deadline bound CPU time instead).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import struct

# <sched.h>, <sys/mount.h>, <linux/prctl.h>
CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS = 0x00020000, 0x02000000, 0x04000000
CLONE_NEWIPC, CLONE_NEWUSER = 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_BIND, MS_REC, MS_PRIVATE, MNT_DETACH = 4096, 16384, 1 << 18, 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP = 38, 22
SECCOMP_MODE_FILTER = 2
SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ERRNO, SECCOMP_RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
ARCHES = {  # machine: (AUDIT_ARCH_*, clone, unshare, clone3)
    "x86_64": (0xC000003E, 56, 272, 435),
    "aarch64": (0xC00000B7, 220, 97, 435),
}
RLIMIT_CALLS = {"x86_64": (160, 302), "aarch64": (164, 261)}  # setrlimit, prlimit64
SIGNAL_CALLS = {  # ptrace, rt_sigqueueinfo, rt_tgsigqueueinfo, pidfd_send_signal
    "x86_64": (101, 129, 297, 424),
    "aarch64": (117, 138, 240, 424),
}
KEYRING_CALLS = {
    "x86_64": (248, 249, 250),
    "aarch64": (217, 218, 219),
}  # add_key, request_key, keyctl
IO_URING_CALLS = (425, 426, 427)  # io_uring_setup, _enter, _register: one number on both
SOCKET_CALLS = {"x86_64": (41, 53), "aarch64": (198, 199)}  # socket, socketpair
AF_UNIX, EAFNOSUPPORT = 1, 97
KEYCTL_JOIN_SESSION_KEYRING = 1
EXPECTED_STATUS = {
    "CapInh": 0,
    "CapPrm": 0,
    "CapEff": 0,
    "CapBnd": 0,
    "CapAmb": 0,
    "NoNewPrivs": 1,
    "Seccomp": 2,
}
"""What /proc/self/status must say once a candidate is confined (every field must be there)."""
CGROUP_MOUNTS = ("/cg/memory", "/cg/pids")
"""Where the candidate zygote's bwrap binds the host's `tempered` cgroup folders."""

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def prctl(option: int, value: int = 0) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    encoded = [None if text is None else text.encode() for text in (source, target, fstype, data)]
    _check(
        _libc.mount(encoded[0], encoded[1], encoded[2], ctypes.c_ulong(flags), encoded[3]),
        f"mount {target}",
    )


def _umount(target: str) -> None:
    _check(_libc.umount2(target.encode(), MNT_DETACH), f"umount {target}")


class PidNamespaces:
    """Forks each child as pid 1 of a new pid namespace: unshare(CLONE_NEWPID), fork, then
    setns back to our own, so the next child gets a fresh namespace too. The caller must be
    single-threaded (a zygote)."""

    def __init__(self) -> None:
        self.own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)

    def fork(self) -> int:
        _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
        try:
            pid = os.fork()
        except BaseException:
            self._restore()
            raise
        if pid != 0:
            self._restore()
        return pid

    def _restore(self) -> None:
        if _libc.setns(self.own, CLONE_NEWPID) != 0:  # later children would share a namespace
            os.write(2, b"zygote: cannot return to its own pid namespace\n")
            os._exit(70)


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    )


def _clear_capabilities() -> None:
    header, data = _CapHeader(0x20080522, 0), (_CapData * 2)()  # _LINUX_CAPABILITY_VERSION_3
    _check(_libc.capset(ctypes.byref(header), data), "capset")


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


def seccomp_filter(allow_ptrace: bool = False) -> bytes:
    """The seccomp filter (`_seccomp_program`) as the kernel reads it, for a sandbox that loads
    it elsewhere: bwrap's --seccomp reads these bytes from a file descriptor (a workspace
    command's, `workspace.py`, with `allow_ptrace`). OSError on an architecture without one."""
    return _pack(_seccomp_program(allow_ptrace))


def _seccomp_program(
    allow_ptrace: bool = False, unix_sockets_only: bool = False
) -> list[tuple[int, int, int, int]]:
    """EPERM for clone/unshare with CLONE_NEWUSER, ENOSYS for clone3 (whose flags live in
    memory a filter cannot read), kill on another architecture or the x32 ABI.

    And EPERM for what would let the candidate, pid 1 of its pid namespace, die of a SIGKILL it
    caused itself (the kernel ignores a kill(1, SIGKILL) from inside the namespace, so the judge
    takes such an end as the platform's): ptrace (a child attached to it could resume it with
    SIGKILL) and a SIGKILL it sends itself with a siginfo that says "from the kernel" (si_code
    SI_KERNEL, which the kernel forces through): rt_sigqueueinfo, rt_tgsigqueueinfo, and
    pidfd_send_signal with a siginfo (without one, it is a plain kill). `allow_ptrace` lets
    ptrace pass, where pid 1 is not the program (a workspace command's sandbox).

    And EPERM for the kernel's keyrings (add_key, request_key, keyctl, as Docker's default
    profile refuses them): they are kept per uid, not per namespace, so a key a run added would
    outlive it, for the next run under the same uid to read. And for io_uring (setup, enter,
    register), as Docker's profile refuses it: no rule here is reachable through it, but it is
    the widest kernel surface a program could otherwise use (its IORING_OP_SOCKET among it).

    And, `unix_sockets_only`, EAFNOSUPPORT for socket() and socketpair() of every family but
    AF_UNIX: for a candidate that shares a network it must not reach (a Kubernetes pod's, whose
    only other barrier is a NetworkPolicy that many CNIs do not enforce). A local candidate has
    an empty network namespace of its own, where no socket reaches anything, so it keeps them."""
    machine = os.uname().machine
    if machine not in ARCHES:
        raise OSError(f"confine: no seccomp filter for {machine}")
    arch, clone, unshare, clone3 = ARCHES[machine]
    ptrace, sigqueueinfo, tgsigqueueinfo, pidfd_send_signal = SIGNAL_CALLS[machine]
    add_key, request_key, keyctl = KEYRING_CALLS[machine]
    kill, ld, jeq, jge, jset, ret = SECCOMP_RET_KILL_PROCESS, 0x20, 0x15, 0x35, 0x45, 0x06
    sigkill = int(signal.SIGKILL)
    sockets: list[tuple[int, int | str, int | str, int] | str] = []
    family: list[tuple[int, int | str, int | str, int] | str] = []
    if unix_sockets_only:
        sockets = [(jeq, "family", 0, call) for call in SOCKET_CALLS[machine]]
        family = [
            "family",
            (ld, 0, 0, 16),  # socket, socketpair: the family (an int: the low word is all)
            (jeq, "allow", 0, AF_UNIX),
            (ret, 0, 0, SECCOMP_RET_ERRNO | EAFNOSUPPORT),
        ]
    return _resolve(
        [
            (ld, 0, 0, 4),  # architecture
            (jeq, 1, 0, arch),
            (ret, 0, 0, kill),
            (ld, 0, 0, 0),  # syscall number
            (jge, 0, 1, 0x40000000),  # x32 syscalls on x86_64
            (ret, 0, 0, kill),
            (jeq, 0, 1, clone3),
            (ret, 0, 0, SECCOMP_RET_ERRNO | 38),  # ENOSYS
            *([] if allow_ptrace else [(jeq, "eperm", 0, ptrace)]),
            (jeq, "eperm", 0, add_key),
            (jeq, "eperm", 0, request_key),
            (jeq, "eperm", 0, keyctl),
            *[(jeq, "eperm", 0, call) for call in IO_URING_CALLS],
            *sockets,
            (jeq, "flags", 0, unshare),
            (jeq, "flags", 0, clone),
            (jeq, "second", 0, sigqueueinfo),
            (jeq, "third", 0, tgsigqueueinfo),
            (jeq, 0, "allow", pidfd_send_signal),
            (ld, 0, 0, 24),  # pidfd_send_signal: the signal (int: the low word is all it reads)
            (jeq, 0, "allow", sigkill),
            (ld, 0, 0, 32),  # low word of the siginfo pointer (a pointer's low word may be 0)
            (jeq, 0, "eperm", 0),
            (ld, 0, 0, 36),  # its high word
            (jeq, "allow", "eperm", 0),
            "second",
            (ld, 0, 0, 24),  # rt_sigqueueinfo: the signal
            (jeq, "eperm", "allow", sigkill),
            "third",
            (ld, 0, 0, 32),  # rt_tgsigqueueinfo: the signal
            (jeq, "eperm", "allow", sigkill),
            "flags",
            (ld, 0, 0, 16),  # low word of the first argument (flags)
            (jset, "eperm", "allow", CLONE_NEWUSER),
            *family,
            "eperm",
            (ret, 0, 0, SECCOMP_RET_ERRNO | 1),
            "allow",
            (ret, 0, 0, SECCOMP_RET_ALLOW),
        ]
    )


def _resolve(
    program: list[tuple[int, int | str, int | str, int] | str],
) -> list[tuple[int, int, int, int]]:
    """A filter program whose jump targets may name a label (a string in the list, marking the
    next instruction), with each name turned into the forward offset the kernel reads."""
    labels: dict[str, int] = {}
    code: list[tuple[int, int | str, int | str, int]] = []
    for item in program:
        if isinstance(item, str):
            labels[item] = len(code)
        else:
            code.append(item)

    def offset(target: int | str, at: int) -> int:
        jump = target if isinstance(target, int) else labels[target] - at - 1
        if not 0 <= jump < 256:
            raise ValueError(f"confine: a jump of {jump} in a filter program")
        return jump

    return [(op, offset(jt, at), offset(jf, at), k) for at, (op, jt, jf, k) in enumerate(code)]


def _rlimits_locked_program() -> list[tuple[int, int, int, int]]:
    """EPERM for setrlimit, and for prlimit64 with a new limit (its third argument, both words
    checked: a pointer's low word may be 0); a prlimit64 that only reads (getrlimit) passes."""
    setrlimit, prlimit64 = RLIMIT_CALLS[os.uname().machine]
    ld, jeq, ret = 0x20, 0x15, 0x06
    return [
        (ld, 0, 0, 0),  # 0: syscall number
        (jeq, 5, 0, setrlimit),  # 1: → 7
        (jeq, 0, 5, prlimit64),  # 2: else → 8
        (ld, 0, 0, 32),  # 3: low word of the third argument (new_limit)
        (jeq, 0, 2, 0),  # 4: not NULL → 7
        (ld, 0, 0, 36),  # 5: its high word
        (jeq, 1, 0, 0),  # 6: NULL → 8
        (ret, 0, 0, SECCOMP_RET_ERRNO | 1),  # 7: EPERM
        (ret, 0, 0, SECCOMP_RET_ALLOW),  # 8
    ]


def _pack(program: list[tuple[int, int, int, int]]) -> bytes:
    """A filter program's instructions as the kernel reads them (struct sock_filter)."""
    return b"".join(struct.pack("=HBBI", *insn) for insn in program)


def _fprog(
    program: list[tuple[int, int, int, int]],
) -> tuple[ctypes.Array[ctypes.c_char], _SockFprog]:
    """A filter program as the kernel reads it (keep the buffer alive as long as the struct)."""
    packed = _pack(program)
    buffer = ctypes.create_string_buffer(packed, len(packed))
    return buffer, _SockFprog(len(program), ctypes.addressof(buffer))


class Confinement:
    """What every child's confinement needs, prepared once in the zygote (so a fork only
    issues system calls): the seccomp programs and the kernel's highest capability number."""

    def __init__(self, unix_sockets_only: bool = False) -> None:
        """`unix_sockets_only`: the filter refuses every socket family but AF_UNIX (for a
        candidate that shares a network: a Kubernetes pod's, `pod_launcher.py`)."""
        self._filters, self._fprog = _fprog(_seccomp_program(unix_sockets_only=unix_sockets_only))
        self._lock_filters, self._lock_fprog = _fprog(_rlimits_locked_program())
        with open("/proc/sys/kernel/cap_last_cap") as handle:
            self._last_cap = int(handle.read())

    def lock_rlimits(self) -> None:
        """Stack a filter that refuses any change of a resource limit (the candidate's, set
        from the run's load message). A CPU limit the program lowered would end it with a
        SIGKILL the host cannot tell from one sent from outside: a platform fault, retried."""
        mode = ctypes.c_ulong(SECCOMP_MODE_FILTER)
        _check(_libc.prctl(PR_SET_SECCOMP, mode, ctypes.byref(self._lock_fprog), 0, 0), "seccomp")

    def apply(self, uid: int, cgroup_procs: list[str], tmpfs_mb: int) -> None:
        """Confine the calling process (a fresh child, pid 1 of its pid namespace, root)."""
        if os.getpid() != 1:
            raise OSError("confine: not pid 1 of a new pid namespace")
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.setsid()
        for procs in cgroup_procs:
            with open(procs, "w") as handle:
                handle.write("0")
        flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP
        _check(_libc.unshare(flags), "unshare")
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        for path in CGROUP_MOUNTS:
            if os.path.ismount(path):
                _umount(path)
        _umount("/proc")
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={tmpfs_mb}m,mode=1777")
        _mount("/tmp", "/dev/shm", None, MS_BIND)
        socket.sethostname("sandbox")
        os.chdir("/tmp")
        self.drop_privileges(uid)

    def drop_privileges(self, uid: int) -> None:
        """Become `uid` for good: every capability dropped (the bounding set too, which needs
        CAP_SETPCAP), no supplementary groups, no_new_privs, the seccomp filter; then verify.
        The Kubernetes pod's launcher calls this alone (its pod has no namespaces to make)."""
        _leave_session_keyring()
        for cap in range(self._last_cap + 1):
            prctl(PR_CAPBSET_DROP, cap)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # clears the permitted, effective and ambient sets
        _clear_capabilities()  # and the inheritable set, which a uid change keeps
        prctl(PR_SET_NO_NEW_PRIVS, 1)
        prctl(PR_SET_DUMPABLE, 1)  # the uid change cleared it; /proc/self stays the program's
        mode = ctypes.c_ulong(SECCOMP_MODE_FILTER)
        _check(_libc.prctl(PR_SET_SECCOMP, mode, ctypes.byref(self._fprog), 0, 0), "seccomp")
        _verify(uid)


def _leave_session_keyring() -> None:
    """Join a new, empty session keyring: a process keeps its parent's across a uid change, and
    possessing the worker's (under systemd, a container runtime) shows its keys' names and sizes
    in /proc/keys. An outer filter that refuses keyctl (a container's) leaves nothing to leave."""
    keyctl = KEYRING_CALLS[os.uname().machine][2]
    if _libc.syscall(keyctl, KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        err = ctypes.get_errno()
        if err not in (1, 13, 38):  # EPERM, EACCES, ENOSYS: keyrings are out of reach here
            raise OSError(err, f"confine: join a session keyring: {os.strerror(err)}")


def _verify(uid: int) -> None:
    """Fail closed unless the kernel confirms the uid, capabilities, no_new_privs and seccomp."""
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (uid, uid, uid) or os.getgroups():
        raise OSError("confine: the uid did not change")
    with open("/proc/self/status") as handle:
        status = dict(line.split(":", 1) for line in handle if ":" in line)
    for field, expected in EXPECTED_STATUS.items():
        if field not in status:
            raise OSError(f"confine: /proc/self/status has no {field}")
        if int(status[field].strip(), 16 if field.startswith("Cap") else 10) != expected:
            raise OSError(f"confine: {field} is {status[field].strip()}")
