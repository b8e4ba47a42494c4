"""The `local` sandbox backend: the two-process verifier on this host, under bubblewrap.

    backend = LocalBackend(load_settings().sandbox.local)       # or get_backend(settings)
    result = await backend.run(program, task.tests, SandboxLimits(), "add", task.helpers,
                               task.hidden_tests)
    await backend.close()

Every run is a fresh checker/candidate pair (`verifier.py`): the checker, forked from a zygote
in an unprivileged bwrap sandbox under the worker's checker uid, holds the tests, the task's
helpers and the verdict; the candidate, forked from a zygote in a privileged bwrap sandbox,
becomes pid 1 of fresh pid, mount, network, ipc, uts and cgroup namespaces under its own uid
and the run's cgroups (memory, pids), with a private tmpfs, no capabilities, no_new_privs and
a seccomp filter (`confine.py`), and runs the model's program. They talk over two pipes, in
plain data only (`codec.py`), so a verdict cannot be forged from the program's side: it never
shares an interpreter, memory or a file descriptor with the code that decides it.

Needs root, bwrap and setpriv (and cgroups v1 for memory limits by cgroup; without them,
RLIMIT_AS bounds memory and `enforcement` says "rlimit"). Elsewhere every run raises
`SandboxInfraError` with one line saying why: there is no weaker fallback.
"""

from __future__ import annotations

import shutil

from infra.sandbox.base import VerifierBackend
from infra.sandbox.cgroups import Cgroups
from infra.sandbox.forkserver import (
    SANDBOX_UID_RANGE,
    ForkServer,
    candidate_zygote_argv,
    root_binds,
    worker_uids,
)
from infra.sandbox.verifier import Verifier
from infra.settings import LocalSandboxSettings

__all__ = ["SANDBOX_UID_RANGE", "LocalBackend", "root_binds", "worker_uids"]


class LocalBackend(VerifierBackend):
    """Runs each program in a fresh checker/candidate pair on this host.

    Warm pool: up to `warm` pairs per tmpfs size are started ahead of time; each serves exactly
    one program and is then destroyed (`warm=0` turns it off; default `config.warm`).
    """

    name = "local"

    def __init__(self, config: LocalSandboxSettings | None = None, warm: int | None = None) -> None:
        config = config or LocalSandboxSettings()
        self.python, self.warm = config.python, config.warm if warm is None else warm
        bwrap = shutil.which("bwrap") or "bwrap"  # a missing bwrap fails the first run, clearly
        launcher = ForkServer(
            "candidate", candidate_zygote_argv(self.python, bwrap, Cgroups.prepare())
        )
        self.verifier = Verifier(launcher, self.python, self.warm, self.name)
