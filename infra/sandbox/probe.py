"""The sandbox worker's start-up probe: can this host run a workspace step's sandbox at all?

    why = probe(runner, host.directory, slot)    # "": serve sessions; else why none can run

It runs `true` as a step does, through `CommandRunner.run` (the one home of "start a step's
sandbox and wait for it": the very sandbox, `CommandRunner.argv`, and the slot's cgroups where
the runner uses them, created, limited, joined, then reaped and removed), with the try's
deadline as the wall-clock limit, over an empty workspace made as a session's is: a 0700
directory owned by the slot's uid in the session host's directory, whose parents `SessionHost`
has checked sandbox uids can pass. (Before, it sat in $TMPDIR, which a sandbox uid may not
reach: a 0700 parent condemned a healthy host.) The run's outcome is the try's: a pass, no
answer in time, or why not in the launcher's words (bwrap's, setpriv's or the shell's stderr,
the signal that killed it: `SandboxNotUp`; the errno of a launcher that could not be started).
`probe` blocks: each run gets an event loop of its own, in a thread of its own where the
caller runs one (the worker builds its plan in its loop). One try costs a sandbox start, ~20 ms.

What a failed try said decides (`definitive`, the one rule): only a fault that no retry can
mend condemns the host, and then only when every one of `PROBE_TRIES` tries failed so; the
worker then refuses `open_sessions` for its lifetime (workers/sandbox.py). A resource
shortage, a try that does not end in time (a loaded host) or an error of no known kind is no
verdict: the worker serves sessions, and a step whose sandbox cannot start fails as before
with a platform fault, retried (on the `sandbox` queue, possibly on another host). A
condemned host refuses every open that lands on it (retried later, on whichever worker takes
it: each refusal delays a task), while other hosts may be healthy, so in doubt it serves. After a try without a verdict the next waits
`PROBE_PAUSE_S`: a shortage that neighbours' sessions cause for a moment may be over.

ENOSPC from bwrap's clone is the one shortage that can also be a setting: a namespace count
used up, or a limit of 0 (`user.max_user_namespaces=0` is RHEL 7's default and a common
hardening), which no retry passes. So on ENOSPC the probe reads the limits of the namespaces
a sandbox makes (`NAMESPACES`, in `limits`, /proc/sys/user) and adds those at 0 to the try's
error (`no_namespaces`), which makes it definitive and names the setting in the verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.cgroups import Cgroups
from infra.sandbox.workspace import SLOTS, Mounts, SandboxNotUp, cgroup_name, session_uid

if TYPE_CHECKING:
    from infra.sandbox.workspace import CommandRunner

T = TypeVar("T")

PROBE_TIMEOUT_S = 10.0
"""How long one try waits for its sandbox (one takes ~20 ms; a loaded host longer)."""
PROBE_TRIES = 2
"""Tries that must all fail definitively before the host is judged unable to run sandboxes."""
PROBE_PAUSE_S = 1.0
"""The wait before the next try after one that failed without a verdict (a resource error)."""
PROBE_DIR = "sandbox-probe"
"""The probe's workspace, in the directory it is given (the session host's)."""
NAMESPACE_LIMITS = Path("/proc/sys/user")
"""Where the kernel's limits on namespaces are (user.max_<kind>_namespaces)."""
NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")
"""The kinds of namespace a sandbox makes (bwrap --unshare-all, and its mounts)."""
ENOSPC = (
    "no space left on device",  # older bwrap: "Creating new namespace failed: No space left..."
    "(enospc)",  # bwrap 0.8: "...: nesting depth or /proc/sys/user/max_*_namespaces exceeded..."
)
"""Words of ENOSPC: a namespace count used up (no verdict), or a limit of 0 (`no_namespaces`)."""
NO_NAMESPACES = "is 0 on this host"
"""What `no_namespaces` adds to an ENOSPC where a namespace limit is 0 (`definitive`)."""
NO_VERDICT = (
    *ENOSPC,  # user.max_user_namespaces (or pid, mnt...) used up
    "resource temporarily unavailable",  # EAGAIN: a pids limit, RLIMIT_NPROC, a full table
    "cannot allocate memory",  # ENOMEM
    "out of memory",
    "too many open files",  # EMFILE, ENFILE
    "disk quota exceeded",  # EDQUOT
)
"""Words of a failure that may pass on the next try (a shortage, often caused by neighbours):
never a verdict, whatever else the error says."""
DEFINITIVE = (
    "operation not permitted",  # EPERM: creating namespaces, setpriv's setresuid, a mount
    "no permissions to creat",  # bwrap: unprivileged user namespaces are disabled
    "does not support user namespaces",  # bwrap: EINVAL, a kernel without them
    "uid map: permission denied",  # an LSM (AppArmor's userns restriction) forbids the map
    "gid map: permission denied",
    "unknown option",  # bwrap older than an option every sandbox uses
    "unrecognized option",  # setpriv's (getopt's) words for the same
    "function not implemented",  # ENOSYS: a seccomp profile that answers so
    "bad system call",  # SIGSYS: a seccomp profile that kills (`_killed`)
    "cannot execute",  # the launching shell is missing or not executable (`_try`)
    "read-only file system",  # EROFS: /proc/sys for --disable-userns, the session directory
)
"""Words of a failure that no retry mends: this host can never run the sandbox."""
logger = logging.getLogger(__name__)


def definitive(said: str) -> bool:
    """Whether a failed try's error (bwrap's, setpriv's, the shell's, the kernel's words) says
    this host can never run a workspace sandbox, so the worker may refuse sessions for good.

    Condemns (`DEFINITIVE`): EPERM ("Operation not permitted", bwrap's "No permissions to
    create a new namespace": user namespaces disabled for unprivileged users, a container
    without the capabilities, a seccomp profile answering EPERM, setpriv refused to change
    uid), a kernel without user namespaces, a uid map an LSM forbids, an option bwrap or
    setpriv does not know (too old), a seccomp profile answering ENOSYS or killing with
    SIGSYS, a launcher that cannot be executed; EROFS ("Read-only file system"): what must
    be written is on a read-only mount, which stays so until the host is set up again (a
    container started without the chart's start script has /proc/sys read-only, so bwrap's
    --disable-userns cannot set user.max_user_namespaces in the sandbox: "cannot open
    /proc/sys/user/max_user_namespaces: Read-only file system"; or the session directory is
    on a read-only file system). And an ENOSPC to which the probe added a namespace limit of 0
    (`NO_NAMESPACES`, `no_namespaces`; checked first): no namespace of that kind can ever be
    made here. A binary missing from PATH is `missing`, checked before any try. These are the
    same on every try, on this host, for every task.

    No verdict (`NO_VERDICT`, which wins over the rest but a limit of 0): ENOSPC, EAGAIN,
    ENOMEM, EMFILE, EDQUOT: a namespace count, pids or memory used up for a moment (often by
    neighbours' sessions), which the next try or the step's retry may pass. Nor does anything
    else (an error of no known kind), nor a try that does not end in time (`probe`)."""
    text = said.lower()
    if NO_NAMESPACES in text:
        return True
    if any(words in text for words in NO_VERDICT):
        return False
    return any(words in text for words in DEFINITIVE)


def no_namespaces(said: str, limits: Path = NAMESPACE_LIMITS) -> str:
    """`said`, a failed try's error, with the namespace limits in `limits` that are 0 named
    after it (`NO_NAMESPACES`) where it is ENOSPC: "bwrap: Creating new namespace failed: No
    space left on device (user.max_user_namespaces is 0 on this host)". A limit whose file is
    missing (an older kernel, another kind) or unreadable is not one."""
    if not any(words in said.lower() for words in ENOSPC):
        return said
    zero = []
    for kind in NAMESPACES:
        with contextlib.suppress(OSError, ValueError):
            if int((limits / f"max_{kind}_namespaces").read_text()) == 0:
                zero.append(f"user.max_{kind}_namespaces {NO_NAMESPACES}")
    return f"{said} ({', '.join(zero)})" if zero else said


def probe(
    runner: CommandRunner, directory: Path | None = None, slot: int = SLOTS - 1,
    timeout_s: float = PROBE_TIMEOUT_S, pause_s: float = PROBE_PAUSE_S,
    limits: Path = NAMESPACE_LIMITS,
) -> str:  # fmt: skip
    """Why no command can run on this host, or "" when one can or no verdict was reached
    (logged): `runner.missing`, else the last error of PROBE_TRIES tries that all failed
    definitively (`definitive`; an ENOSPC with the namespace limits of `limits` that are 0,
    `no_namespaces`). Each try runs `true` as uid `session_uid(slot)` (a slot the caller
    holds) in a workspace made in `directory`, which sandbox uids must reach (the session
    host's); without one, in a fresh 0711 directory of $TMPDIR. Blocks."""
    if runner.missing:
        return runner.missing
    own = directory is None
    directory = Path(tempfile.mkdtemp("-probe")) if directory is None else directory
    failures: list[str | None] = []  # None: no answer in time
    try:
        if own:
            directory.chmod(0o711)
        for _ in range(PROBE_TRIES):
            if failures and failures[-1] is not None and not definitive(failures[-1]):
                time.sleep(pause_s)  # a shortage may pass; a timeout has waited already
            outcome = _try(runner, directory, slot, timeout_s)
            if outcome == "":
                return ""
            failures.append(outcome if outcome is None else no_namespaces(outcome, limits))
    finally:
        if own:
            shutil.rmtree(directory, ignore_errors=True)
    if all(failure is not None and definitive(failure) for failure in failures):
        return (
            f"no workspace sandbox comes up on this host: {failures[-1]} (bwrap needs root "
            "or unprivileged user namespaces (user.max_*_namespaces above 0), a writable "
            "/proc/sys, and no seccomp profile or dropped capability that forbids new "
            "namespaces)"
        )
    said = "; ".join(f"no answer in {timeout_s}s" if f is None else f for f in failures)
    logger.warning(
        "workspace sandbox probe: %d of %d tries failed without a verdict (%s); serving "
        "sessions", len(failures), PROBE_TRIES, said,
    )  # fmt: skip
    return ""


def _try(runner: CommandRunner, directory: Path, slot: int, timeout_s: float) -> str | None:
    """Run `true` as a step of slot `slot` (`CommandRunner.run`) over an empty workspace: "" if
    it ran, None if it did not end in `timeout_s` (killed), else why not (on one line)."""
    uid, workspace, name = session_uid(slot), directory / PROBE_DIR, cgroup_name(slot)
    try:
        _remove(workspace)  # a dead try's
        workspace.mkdir(mode=0o700)  # as a session's: its uid's, under 0711 parents
        if os.geteuid() == 0:
            os.chown(workspace, uid, uid)
        limits = SandboxLimits(timeout_s=timeout_s)
        result = _blocking(runner.run("true", Mounts(workspace), uid, limits, name))
    except SandboxNotUp as exc:  # bwrap never reported the command's start, or its end
        if isinstance(launch := exc.__cause__, OSError):  # the launcher did not start at all
            unusable = launch.errno in (errno.ENOENT, errno.EACCES, errno.ENOEXEC)
            what = launch.filename or "the launcher"
            return f"cannot {'execute' if unusable else 'start'} {what}: {launch.strerror}"
        return None if exc.timed_out else _said(exc.stderr, exc.returncode)
    except SandboxInfraError as exc:  # the cgroups, a global OOM kill, a sandbox that won't die
        return str(exc)
    except OSError as exc:  # the workspace (a root without CAP_CHOWN), a pipe
        return f"cannot prepare its workspace: {exc}"
    finally:
        if runner.use_cgroups and any(p.exists() for p in Cgroups.named(name).paths.values()):
            logger.warning("workspace sandbox probe: cgroups %s did not empty", name)
        _remove(workspace)
    if result.status is ExecStatus.PASSED:
        return ""
    if result.status is ExecStatus.TIMEOUT:
        return None
    said = " ".join(result.stderr.split())[-1000:]
    return f"{said} ({result.detail})".lstrip()  # it came up, but `true` failed in it


def _blocking(run: Coroutine[Any, Any, T]) -> T:
    """`run`, awaited to its end in a fresh event loop: in this thread, or in one of its own
    where this thread runs a loop already (the worker builds its plan in one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(run)
    with ThreadPoolExecutor(1, thread_name_prefix="sandbox-probe") as thread:
        return thread.submit(asyncio.run, run).result()


def _said(stderr: str, returncode: int | None) -> str:
    """What a launcher said on stderr, on one line, and the signal that killed it, if any;
    its exit status where it said nothing."""
    said = " ".join(stderr.split())[-1000:]
    return " ".join(filter(None, [said, _killed(returncode)])) or (
        f"exit status {returncode}, no error text"
    )


def _killed(returncode: int | None) -> str:
    """How a signal ended the launcher ("" when none did): SIGSYS is a seccomp kill."""
    if returncode is None or returncode >= 0:
        return ""
    with contextlib.suppress(ValueError):
        return f"(killed by {signal.Signals(-returncode).name}: {signal.strsignal(-returncode)})"
    return f"(killed by signal {-returncode})"


def _remove(workspace: Path) -> None:
    """Remove the probe's workspace: empty (`true` writes nothing), so a root without
    CAP_DAC_OVERRIDE, who may not list the sandbox uid's 0700 directory, removes it too."""
    try:
        workspace.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        shutil.rmtree(workspace, ignore_errors=True)
