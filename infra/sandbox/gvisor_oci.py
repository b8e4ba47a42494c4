"""The OCI runtime config of a gVisor candidate's container (`config.json` of its bundle).

    config = oci_config(python, spec)                  # a run's candidate (`gvisor.py`)
    config = oci_config(python, spec, ["python3", "-c", "print('up')"])    # a probe's

The container's only process is `python3 -S -I -c <zygote.py> serve 0 1 <codec, candidate
sources>` under the run's uid: an empty read-only root, the host's /usr, /bin, /lib and /lib64
read-only, a tmpfs /tmp and /dev/shm of the run's size each, its own pid, network, ipc, uts and
mount namespaces, no capabilities, no-new-privileges, and the run's cgroups (memory, pids:
runsc makes the container's own group inside them, so the run's limits and OOM events cover
the whole sandbox).

Not covered: starting, watching and deleting the container (`gvisor.py`); runsc's own flags
(network none, the platform), which are its command line's, not the config's.
"""

from __future__ import annotations

from pathlib import Path

from infra.sandbox.forkserver import zygote_source
from infra.sandbox.launcher import CandidateSpec

TMPFS = ("/tmp", "/dev/shm")
"""The container's writable directories, a tmpfs of the run's `tmpfs_mb` each (/dev/shm:
multiprocessing's locks and queues, sem_open, need it writable)."""
CANDIDATE_MODULES = ("codec", "candidate")
"""What the container's interpreter loads (sources in its argv; nothing of the job)."""


def oci_config(
    python: str, spec: CandidateSpec, args: list[str] | None = None
) -> dict[str, object]:
    """The OCI runtime config of one candidate container (running `args` instead: a probe's)."""
    ro = ["rbind", "ro", "nosuid", "nodev"]
    tmpfs: dict[str, object] = {
        "type": "tmpfs",
        "source": "tmpfs",
        "options": ["nosuid", "nodev", f"size={spec.tmpfs_mb}m", "mode=1777"],
    }
    mounts: list[dict[str, object]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        *({"destination": path, **tmpfs} for path in TMPFS),
        {"destination": "/usr", "type": "bind", "source": "/usr", "options": ro},
    ]
    for name in ("bin", "lib", "lib64"):
        path = Path("/") / name
        if path.exists():
            mounts.append(
                {
                    "destination": str(path),
                    "type": "bind",
                    "source": str(path.resolve()),
                    "options": ro,
                }
            )
    here = Path(__file__).parent
    sources = [
        part
        for name in CANDIDATE_MODULES
        for part in (f"infra.sandbox.{name}", (here / f"{name}.py").read_text())
    ]
    linux: dict[str, object] = {
        "namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]
    }
    if spec.cgroups is not None:
        linux["cgroupsPath"] = f"/tempered/{spec.cgroups.name}/sandbox"
    return {
        "ociVersion": "1.0.0",
        "process": {
            "terminal": False,
            "user": {"uid": spec.uid, "gid": spec.uid},
            "args": args
            or [python, "-S", "-I", "-c", zygote_source(), "serve", "0", "1", *sources],
            "env": ["PATH=/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8", "MALLOC_ARENA_MAX=2"],
            "cwd": "/tmp",
            "capabilities": {
                k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")
            },
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "sandbox",
        "mounts": mounts,
        "linux": linux,
    }
