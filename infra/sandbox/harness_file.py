"""The sandbox harness (`harness.py`) compiled once per interpreter, for backends that mount it.

    from infra.sandbox.harness_file import HARNESS_IN_SANDBOX, harness_file
    pyc = harness_file("/usr/bin/python3")       # bind `pyc` at HARNESS_IN_SANDBOX
    argv = [python, "-S", "-I", HARNESS_IN_SANDBOX]

Used by the `local` (bwrap) and `gvisor` backends; the `kubernetes` backend ships the source in
the Job instead (kubernetes_job.py). What the harness does is harness.py's business.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

from infra.sandbox.base import SandboxInfraError

HARNESS_IN_SANDBOX = "/harness.pyc"
"""Where a backend mounts the compiled harness inside the sandbox."""
_COMPILE = "import py_compile, sys; py_compile.compile(sys.argv[1], sys.argv[2], doraise=True)"


def harness_source() -> str:
    """The text of harness.py."""
    return (Path(__file__).parent / "harness.py").read_text()


@functools.cache
def harness_file(python: str) -> Path:
    """harness.py compiled by the sandbox's own interpreter, in a root-only-writable temp dir.

    Running the .pyc skips compiling ~300 lines at every start (a third of Python's start-up).
    The dir is named by the source and interpreter, so workers share it instead of piling up.
    Raises SandboxInfraError when `python` cannot compile it.
    """
    source = harness_source()
    digest = hashlib.sha256(f"{python}\0{source}".encode()).hexdigest()[:16]
    final = Path(tempfile.gettempdir()) / f"tempered-harness-{digest}"
    compiled = final / "harness.pyc"
    info = final.stat() if final.is_dir() and not final.is_symlink() else None
    if info and info.st_uid == os.geteuid() and not info.st_mode & 0o022 and compiled.is_file():
        return compiled
    folder = Path(tempfile.mkdtemp(prefix="tempered-harness-"))
    folder.chmod(0o755)
    (folder / "harness.py").write_text(source)
    done = subprocess.run(  # noqa: S603 - our interpreter, our file
        [
            python,
            "-S",
            "-I",
            "-c",
            _COMPILE,
            str(folder / "harness.py"),
            str(folder / "harness.pyc"),
        ],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise SandboxInfraError(
            f"{python} cannot compile the harness: {done.stderr.decode()[-500:]}"
        )
    (folder / "harness.pyc").chmod(0o644)
    try:
        folder.rename(final)
    except OSError:  # another worker won the race, or a stranger owns the name: use ours
        return folder / "harness.pyc"
    return compiled
