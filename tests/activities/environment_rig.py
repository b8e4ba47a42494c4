"""Workspace activities for a test, on this host's sandbox (bwrap) over a session root of their
own, removed afterwards:

    async with environment_activities(store, "sandbox-x", max_task_memory_mb=1024) as acts:
        ...

`workspaces`: fields of `WorkspaceSettings` beside the root. Needs root (`needs_root`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from activities.environment import EnvironmentActivities
from infra.environments.mounts import remove_tree
from infra.sandbox.local import LocalBackend
from infra.settings import SandboxSettings, Settings, WorkspaceSettings
from infra.storage import ObjectStore
from tests.infra.environments.conftest import session_root


@contextlib.asynccontextmanager
async def environment_activities(
    store: ObjectStore, queue: str, **workspaces: Any
) -> AsyncIterator[EnvironmentActivities]:
    root = session_root()
    assert root.name.startswith("tempered-test-sessions-")
    config = WorkspaceSettings(root=root, **workspaces)
    settings = Settings(sandbox=SandboxSettings(workspaces=config))
    activities = EnvironmentActivities(settings, queue, store, LocalBackend(warm=0))
    try:
        yield activities
    finally:
        await activities.close()
        await activities.backend.close()
        remove_tree(root)
