"""The bundle of a gVisor candidate's container: its OCI runtime config and its root.

    write_bundle(bundle, python, spec)                 # a run's candidate (`gvisor.py`)
    write_bundle(bundle, python, spec, ["python3", "-c", "print('up')"])   # a probe's

The container's only process is `python3 -S -I -c <zygote.py> serve 0 1 <codec, candidate
sources>` under the run's uid: an empty read-only root, the host's /usr, /bin, /lib and /lib64
read-only, one tmpfs of the run's size at /dev/shm with /tmp a link to it (`SHARED`), its own
pid, network, ipc, uts and mount namespaces, no capabilities, no-new-privileges, and the run's
cgroups (memory, pids: runsc makes the container's own group inside them, so the run's limits
and OOM events cover the whole sandbox).

Not covered: starting, watching and deleting the container (`gvisor.py`); runsc's own flags
(network none, the platform), which are its command line's, not the config's.
"""

from __future__ import annotations

import json
from pathlib import Path

from infra.sandbox.forkserver import zygote_source
from infra.sandbox.launcher import CandidateSpec

SHARED = "/dev/shm"
"""The container's one writable directory, a tmpfs of `CandidateSpec.tmpfs_mb` (at most the
run's `memory_mb` on gVisor: `launcher.candidate_tmpfs_mb`); /tmp is a link to
it in the bundle's root, as the local candidate's /dev/shm is a bind of its /tmp: what a
program keeps in files is bounded once, not once per directory (gVisor's tmpfs is outside its
address-space cap). /dev/shm holds it, not /tmp: /dev is gVisor's own, where no link can be
made; multiprocessing's locks and queues (sem_open) need it writable. The working directory
and HOME are /tmp (the program's getcwd says /dev/shm)."""
KEEPER = f"{SHARED}/.tempered"
"""An empty read-only tmpfs inside `SHARED`: runsc mounts a tmpfs of its own, of no size, at a
/tmp it finds empty (through the link), and a non-empty one it leaves alone."""
CANDIDATE_MODULES = ("codec", "candidate")
"""What the container's interpreter loads (sources in its argv; nothing of the job)."""


def write_bundle(
    bundle: Path, python: str, spec: CandidateSpec, args: list[str] | None = None
) -> None:
    """Make the bundle of one candidate container in the empty directory `bundle`: its root
    (empty, but for the /tmp link) and its config (`oci_config`)."""
    (bundle / "rootfs").mkdir()
    (bundle / "rootfs" / "tmp").symlink_to(SHARED)
    (bundle / "config.json").write_text(json.dumps(oci_config(python, spec, args)))


def oci_config(
    python: str, spec: CandidateSpec, args: list[str] | None = None
) -> dict[str, object]:
    """The OCI runtime config of one candidate container (running `args` instead: a probe's)."""
    ro = ["rbind", "ro", "nosuid", "nodev"]
    mounts: list[dict[str, object]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": SHARED,
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "nodev", f"size={spec.tmpfs_mb}m", "mode=1777"],
        },
        {
            "destination": KEEPER,
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["ro", "nosuid", "nodev", "noexec", "size=4k", "mode=0555"],
        },
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
