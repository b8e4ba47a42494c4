"""An empty workspace that a workspace slot's uid can reach, for tests that run commands in it
with `CommandRunner` and leave nothing behind (it is removed with rmdir only):

    with empty_workspace(SLOT, "tempered-x-") as ws:
        ...
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

from infra.sandbox.workspace import session_uid


@contextlib.contextmanager
def empty_workspace(slot: int, prefix: str) -> Iterator[Path]:
    """pytest's tmp_path is root's alone: the workspace's parent is searchable by all, the
    workspace itself the slot uid's."""
    parent = Path(tempfile.mkdtemp(prefix=prefix))
    parent.chmod(0o711)
    ws = parent / "ws"
    ws.mkdir(mode=0o700)
    os.chown(ws, session_uid(slot), session_uid(slot))
    yield ws
    assert parent.name.startswith(prefix) and parent.parent == Path(tempfile.gettempdir())
    ws.rmdir()
    parent.rmdir()
