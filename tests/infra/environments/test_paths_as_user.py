"""`infra.environments.paths.as_user` when the kernel refuses a filesystem id: the thread (an
executor's, reused for the next session's file operations) keeps root's ids, not half of the
session's. What the session's ids let it read and write is test_workspace_file_rights.py's."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from infra.environments import paths

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: only root changes ids")
SESSION_UID = 54321


def fs_ids() -> tuple[int, int]:
    """This thread's (filesystem uid, filesystem gid): the fourth of /proc's Uid and Gid."""
    fields = dict(
        line.split(":", 1) for line in Path("/proc/thread-self/status").read_text().splitlines()
    )
    return int(fields["Uid"].split()[3]), int(fields["Gid"].split()[3])


def test_a_refused_setfsuid_leaves_the_threads_fsgid_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the fsgid was set before the block that restores it: a setfsuid that failed
    left the thread with the session's gid for whatever it did next."""
    real = paths._LIBC

    def setfsuid(uid: int) -> int:  # refused, as the kernel does: the current id, unchanged
        return int(real.setfsuid(-1))

    monkeypatch.setattr(paths, "_LIBC", SimpleNamespace(setfsgid=real.setfsgid, setfsuid=setfsuid))
    try:
        with pytest.raises(OSError, match="setfsuid"), paths.as_user(tmp_path, SESSION_UID):
            pass
        assert fs_ids() == (os.geteuid(), os.getegid())
    finally:  # whatever failed, the next test's thread is root's again
        real.setfsuid(os.geteuid())
        real.setfsgid(os.getegid())
