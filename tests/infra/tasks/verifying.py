"""Workspaces scored through the real verifier, for tests that compare them with scores
computed in-process (test_hidden_tests_strength.py, test_workspace_trivial_programs.py).

    scores = verified_scores(objects, [spec, ...], "strength")   # as root, with bwrap

Each spec's `files` is restored as a session of its own and verified with the validation
limits, all at once; the host, trees and backend are closed and the session root removed after.
"""

from __future__ import annotations

import asyncio

from contracts.task import WorkspaceSpec
from infra.environments.mounts import remove_tree
from infra.environments.snapshots import MemoryObjects
from tests.infra.environments.conftest import session_root


def verified_scores(objects: MemoryObjects, specs: list[WorkspaceSpec], name: str) -> list[float]:
    """The verifier's score of each spec's workspace, in order (`objects` hold their trees)."""
    from infra.environments.sessions import SessionHost
    from infra.environments.snapshots import Trees
    from infra.environments.workspace import WorkspaceEnvironment
    from infra.sandbox import get_backend
    from infra.sandbox.workspace import CommandRunner
    from infra.settings import SandboxSettings, Settings, WorkspaceSettings
    from infra.tasks.validate import VALIDATION_LIMITS

    root = session_root()
    settings = Settings(sandbox=SandboxSettings(workspaces=WorkspaceSettings(root=root)))
    trees = Trees(objects)
    host = SessionHost(settings.sandbox.workspaces)
    backend = get_backend(settings, None)
    env = WorkspaceEnvironment(host, trees, CommandRunner(), backend)

    async def score(n: int, spec: WorkspaceSpec) -> float:
        session = f"{name}-{n}"
        try:
            state = await env.reset(spec, session)
            graded = await env.verify(spec, state, VALIDATION_LIMITS)
        finally:
            await env.close([session])
        return float(graded.score)

    async def run() -> list[float]:
        try:
            return list(await asyncio.gather(*(score(n, s) for n, s in enumerate(specs))))
        finally:
            await host.shutdown()
            trees.close()
            await backend.close()

    try:
        return asyncio.run(run())
    finally:
        remove_tree(root)
