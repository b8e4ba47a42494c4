"""Fixtures of the environment tests: a workspace environment over real bwrap, trees in memory.

rig       a `Rig`: WorkspaceEnvironment + SessionHost (its own root under /tmp) + Trees over
          MemoryObjects + the local sandbox backend (two-process verifier, started lazily)
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from contracts.episode import ToolCall
from contracts.task import WorkspaceSpec
from infra.environments.mounts import remove_tree
from infra.environments.sessions import SessionHost
from infra.environments.snapshots import MemoryObjects, Trees
from infra.environments.tree import Check, File, Packed, pack_files
from infra.environments.workspace import WorkspaceEnvironment
from infra.sandbox.local import LocalBackend
from infra.sandbox.workspace import CommandRunner
from infra.settings import WorkspaceSettings

needs_root = pytest.mark.skipif(
    shutil.which("bwrap") is None or os.geteuid() != 0, reason="needs bwrap and root"
)
SCRIPT_CHECK = Check(kind="script", tests="test.sh")


def session_root() -> Path:
    """A fresh sessions root whose parents sandbox uids can pass (pytest's tmp_path is 0700)."""
    return Path(tempfile.mkdtemp(prefix="tempered-test-sessions-"))


@dataclass
class Rig:
    env: WorkspaceEnvironment
    host: SessionHost
    objects: MemoryObjects
    trees: Trees

    def add(self, packed: Packed) -> Packed:
        self.objects.update(packed.objects)
        return packed

    def spec(
        self,
        files: Mapping[str, File | bytes | str],
        tests: Mapping[str, File | bytes | str] | None = None,
        check: Check = SCRIPT_CHECK,
        **fields: object,
    ) -> WorkspaceSpec:
        initial = self.add(pack_files(files))
        hidden = self.add(
            pack_files(tests or {"test.sh": "echo 1 > /logs/verifier/reward.txt\n"}, check)
        )
        return WorkspaceSpec(files=initial.ref, verifier=hidden.ref, **fields)  # type: ignore[arg-type]


@pytest_asyncio.fixture
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    """Sessions of 2 MB workspaces (`disk` from an indirect parameter, else `auto`)."""
    objects = MemoryObjects()
    trees = Trees(objects)
    root = session_root()
    disk = getattr(request, "param", "auto")
    host = SessionHost(WorkspaceSettings(root=root, max_workspace_mb=2, disk=disk))
    backend = LocalBackend(warm=0)
    try:
        yield Rig(WorkspaceEnvironment(host, trees, CommandRunner(), backend), host, objects, trees)
    finally:
        await host.shutdown()
        await backend.close()
        trees.close()
        remove_tree(root)


UNHELD = ToolCall(
    name="bash",
    arguments={"command": 'f="$(ls | head -n 1)"; stat -c %a "$f"; touch -d @1 .'},
)
"""Prints the mode of the workspace's first file, then changes what no snapshot holds (the
times of the workspace's own directory): a change that leaves the tree digest as it was.
(Modes were such a change until snapshots kept them.)"""
