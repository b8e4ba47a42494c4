"""The sandbox worker's plan (workers/sandbox.py) on a host without bubblewrap: it says so once
at start and refuses workspace sessions with a non-retryable error, while its programs run on.

Before, such a worker (the Helm chart's, whose backend is `kubernetes`) opened the sessions and
failed every step with `bwrap is missing`, a platform fault that Temporal retried for ever.
Only the plan is built here: no Temporal server, no object store call, no sandbox run.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.environment import EnvironmentActivities
from contracts.common import ObjectRef
from contracts.episode import OpenSessionsRequest
from contracts.errors import NON_RETRYABLE, ErrorType
from contracts.names import Activity
from contracts.task import EnvName, WorkspaceSpec
from infra.environments.mounts import remove_tree
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.workspace import CommandRunner
from infra.settings import SandboxSettings, Settings, WorkspaceSettings
from tests.infra.environments.conftest import session_root
from workers import sandbox
from workers.plan import WorkerPlan

REF = ObjectRef(key="tasks/w/files.tar.zst", size=1, sha256="0" * 64)
REQUEST = OpenSessionsRequest(
    run_id="run-w",
    task_id="workspace-fix-1",
    env=EnvName.WORKSPACE,
    workspace=WorkspaceSpec(files=REF, verifier=REF),
    samples=[0, 1],
)


class IdleBackend:
    """The worker's program backend (its Kubernetes Jobs in the chart): never called here."""

    name = "kubernetes"

    async def run(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no program runs here")

    async def close(self) -> None:
        pass


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    monkeypatch.setattr(sandbox, "get_backend", lambda settings: IdleBackend())
    root = session_root()
    workspaces = WorkspaceSettings(root=root, disk="directory")
    try:
        yield Settings(sandbox=SandboxSettings(workspaces=workspaces))
    finally:
        remove_tree(root)


def activities(plan: WorkerPlan) -> dict[str, Any]:
    return {str(activity._Definition.must_from_callable(fn).name): fn for fn in plan.activities}


def without_bwrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A host whose PATH holds no bwrap (nor setpriv), as the chart's worker image."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("bwrap") is None


@pytest.mark.asyncio
async def test_a_worker_without_bwrap_refuses_workspace_sessions_for_good(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    without_bwrap(monkeypatch, tmp_path)
    with caplog.at_level(logging.WARNING, logger="tempered.worker"):
        plan = sandbox.build(settings)
    try:
        lines = [r.getMessage() for r in caplog.records if r.name == "tempered.worker"]
        assert len(lines) == 1 and "no workspace sessions" in lines[0], lines
        assert "bwrap is missing" in lines[0]
        served = activities(plan)
        assert Activity.EXECUTE.value in served  # its programs still run (as Jobs)
        with pytest.raises(ApplicationError) as refused:
            await ActivityEnvironment().run(served[Activity.OPEN_SESSIONS.value], REQUEST)
        error = refused.value
        assert error.type == ErrorType.SANDBOX_MISCONFIGURED and error.non_retryable
        assert error.type in NON_RETRYABLE  # every activity retry policy stops on it too
        assert "task workspace-fix-1" in str(error) and "bwrap is missing" in str(error)
        assert "bubblewrap" in str(error)  # what to do about it
    finally:
        assert plan.on_shutdown is not None
        await plan.on_shutdown()


@pytest.mark.asyncio
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bwrap")
async def test_a_worker_with_bwrap_serves_workspace_sessions(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="tempered.worker"):
        plan = sandbox.build(settings)
    try:
        opens = activities(plan)[Activity.OPEN_SESSIONS.value]
        assert isinstance(getattr(opens, "__self__", None), EnvironmentActivities)
        assert not [r for r in caplog.records if r.name == "tempered.worker"]
    finally:
        assert plan.on_shutdown is not None
        await plan.on_shutdown()


def test_a_command_on_a_host_without_bwrap_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    without_bwrap(monkeypatch, tmp_path)
    runner = CommandRunner()
    assert runner.missing.startswith("bwrap is missing")
    with pytest.raises(SandboxInfraError, match="bwrap is missing.*install bubblewrap"):
        runner.argv("true", None, 0, None, None, 0)  # type: ignore[arg-type]
