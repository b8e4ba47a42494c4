"""The sandbox worker's plan (workers/sandbox.py) on a host without bubblewrap, or whose
bubblewrap cannot create its sandbox: it says so once at start and refuses workspace sessions
with a retryable error after a long delay, while its programs run on.

Before, such a worker (the Helm chart's, whose backend is `kubernetes`; a host without
unprivileged user namespaces, a seccomp profile, a container without the capabilities) opened
the sessions and failed every step with a platform fault that Temporal retried for ever. Then it
refused them with the non-retryable `SandboxMisconfigured`: `open_sessions` runs on the shared
`sandbox` queue, so one bad host among good ones failed, for good, each task whose open it took,
and with it the training run. Now the open is retried, a while later, on whichever worker takes
it. A resource shortage at start (user namespaces used up by neighbours for a moment) or a
$TMPDIR that sandbox uids cannot reach refuses nothing: the probe runs in a session's slot,
cgroups and directory, and condemns only what no retry mends. Only the plan is built here, and
the start-up probe run: no Temporal server, no object store call, no step.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import timedelta
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
from contracts.sandbox import ExecuteRequest
from contracts.task import EnvName, WorkspaceSpec
from infra.environments.mounts import remove_tree
from infra.sandbox.base import SandboxInfraError
from infra.sandbox.workspace import CommandRunner
from infra.settings import SandboxSettings, Settings, WorkspaceSettings
from tests.infra.environments.conftest import session_root
from tests.infra.sandbox.argv_faults import alter_argv, fail_with, reject_option
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


def probes(
    monkeypatch: pytest.MonkeyPatch, reject: bool = False, error: str = "",
    mounts: list[Any] | None = None,
) -> list[str]:  # fmt: skip
    """The commands the runners' sandboxes are built for from now on (`CommandRunner.argv`);
    with `reject`, bwrap itself refuses each of them (an option it does not know), as a bwrap
    that may not create its namespaces refuses every sandbox; with `error`, each fails with
    that text on stderr, as bwrap would. Each one's `Mounts` and cgroups go to `mounts`."""

    def change(runner: CommandRunner, line: list[str], args: tuple[Any, ...]) -> list[str]:
        if mounts is not None:
            mounts.append((args[0], args[3]))
        if reject:
            line = reject_option(runner, line, args)
        return fail_with(f"echo '{error}' >&2; exit 1")(runner, line, args) if error else line

    return alter_argv(monkeypatch, change)


def assert_retried_later(
    error: ApplicationError, kind: ErrorType = ErrorType.SESSIONS_UNAVAILABLE
) -> None:
    """A fault of this host, not of the task: retried, on whichever worker takes it, a while
    later (a worker that refuses at once would otherwise take the retry again and again)."""
    assert error.type == kind and not error.non_retryable
    assert error.type not in NON_RETRYABLE  # no activity retry policy stops on it either
    assert error.next_retry_delay == timedelta(seconds=sandbox.REFUSED_RETRY_S)
    assert sandbox.REFUSED_RETRY_S >= 60


def without_bwrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A host whose PATH holds no bwrap (nor setpriv), as the chart's worker image."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert shutil.which("bwrap") is None


@pytest.mark.asyncio
async def test_a_worker_without_bwrap_refuses_workspace_sessions_to_be_retried_later(
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
        assert_retried_later(error)
        assert "task workspace-fix-1" in str(error) and "bwrap is missing" in str(error)
        assert "bubblewrap" in str(error)  # what to do about it
    finally:
        assert plan.on_shutdown is not None
        await plan.on_shutdown()


@pytest.mark.asyncio
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bwrap")
async def test_a_worker_with_bwrap_serves_workspace_sessions(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    mounts: list[Any] = []
    asked = probes(monkeypatch, mounts=mounts)
    with caplog.at_level(logging.WARNING, logger="tempered.worker"):
        plan = sandbox.build(settings)
    try:
        assert asked == ["true"]  # it started one sandbox, which came up
        opens = activities(plan)[Activity.OPEN_SESSIONS.value]
        assert isinstance(getattr(opens, "__self__", None), EnvironmentActivities)
        assert not [r for r in caplog.records if r.name == "tempered.worker"]
        host = opens.__self__.host
        ((mounted, cgroups),) = mounts
        assert mounted.workspace.parent == host.directory  # where sessions live
        assert host.take_slot() == 0  # the probe's slot was given back
        if opens.__self__.env.runner.use_cgroups:  # the slot's cgroups, as a step's
            assert cgroups is not None and cgroups.name == f"{os.getpid()}-w0"
    finally:
        assert plan.on_shutdown is not None
        await plan.on_shutdown()


@pytest.mark.asyncio
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bwrap")
async def test_a_worker_whose_bwrap_cannot_make_a_sandbox_refuses_workspace_sessions(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """bwrap is there but fails to set up the sandbox a step would get: the worker says why in
    bwrap's own words, once, and refuses sessions as one without bwrap does."""
    asked = probes(monkeypatch, reject=True)
    with caplog.at_level(logging.WARNING, logger="tempered.worker"):
        plan = sandbox.build(settings)
    try:
        assert asked == ["true"] * 2  # tried again before condemning the host
        lines = [r.getMessage() for r in caplog.records if r.name == "tempered.worker"]
        assert len(lines) == 1 and "\n" not in lines[0], lines
        assert lines[0].startswith("sandbox worker: no workspace sessions on this worker: ")
        assert "bwrap: Unknown option --no-such-option" in lines[0]  # bwrap's own error
        served = activities(plan)
        assert Activity.EXECUTE.value in served
        with pytest.raises(ApplicationError) as refused:
            await ActivityEnvironment().run(served[Activity.OPEN_SESSIONS.value], REQUEST)
        error = refused.value
        assert_retried_later(error)
        assert "task workspace-fix-1" in str(error) and "bwrap: Unknown option" in str(error)
        assert len(asked) == 2  # refused without starting a sandbox
    finally:
        assert plan.on_shutdown is not None
        await plan.on_shutdown()


@pytest.mark.asyncio
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bwrap")
async def test_a_worker_short_of_namespaces_at_start_serves_workspace_sessions(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """user.max_user_namespaces used up for a moment by neighbours' sessions: the worker must
    not refuse, for its whole life, the sessions of every task that lands on it."""
    error = "bwrap: Creating new namespace failed: No space left on device"
    asked = probes(monkeypatch, error=error)
    with caplog.at_level(logging.WARNING):
        plan = sandbox.build(settings)
    try:
        assert asked == ["true"] * 2  # tried again (a second later), no verdict
        opens = activities(plan)[Activity.OPEN_SESSIONS.value]
        assert isinstance(getattr(opens, "__self__", None), EnvironmentActivities)
        assert not [r for r in caplog.records if r.name == "tempered.worker"]
        assert f"({error}; {error}); serving sessions" in caplog.text
    finally:
        assert plan.on_shutdown is not None
        await plan.on_shutdown()


@pytest.mark.asyncio
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bwrap")
async def test_a_worker_whose_tmpdir_sandbox_uids_cannot_reach_serves_workspace_sessions(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """$TMPDIR under a 0700 directory (a user's own): sessions live elsewhere (the sessions
    root, which sandbox uids reach), and so does the probe's workspace."""
    private = Path(tempfile.mkdtemp(prefix="tempered-test-private-"))  # 0700
    (private / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(private / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(private / "tmp"))
    try:
        with caplog.at_level(logging.WARNING):
            plan = sandbox.build(settings)
        try:
            opens = activities(plan)[Activity.OPEN_SESSIONS.value]
            assert isinstance(getattr(opens, "__self__", None), EnvironmentActivities)
            assert not caplog.text  # it came up: no refusal, no warning
        finally:
            assert plan.on_shutdown is not None
            await plan.on_shutdown()
    finally:
        shutil.rmtree(private)


def test_a_command_on_a_host_without_bwrap_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    without_bwrap(monkeypatch, tmp_path)
    runner = CommandRunner()
    assert runner.missing.startswith("bwrap is missing")
    with pytest.raises(SandboxInfraError, match="bwrap is missing.*install bubblewrap"):
        runner.argv("true", None, 0, None, None, 0)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_sessions_close_that_fails_still_closes_the_programs(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sessions' close raised, and the programs' (the shared backend: its Jobs' client)
    was skipped."""
    without_bwrap(monkeypatch, tmp_path)
    closed: list[str] = []

    async def failing(self: EnvironmentActivities) -> None:
        closed.append("sessions")
        raise OSError("a session directory would not go")

    async def programs(self: Any) -> None:
        closed.append("programs")

    monkeypatch.setattr(EnvironmentActivities, "close", failing)
    monkeypatch.setattr(sandbox.SandboxActivities, "close", programs)
    plan = sandbox.build(settings)
    assert plan.on_shutdown is not None
    with caplog.at_level(logging.ERROR, logger="tempered.worker"):
        await plan.on_shutdown()
    assert closed == ["sessions", "programs"]
    assert "a session directory would not go" in caplog.text


@pytest.mark.asyncio
@pytest.mark.skipif(
    shutil.which("setpriv") is None or os.geteuid() != 0, reason="needs setpriv and root"
)
async def test_a_worker_whose_runsc_runs_no_container_refuses_programs_to_be_retried_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The gvisor backend with a platform this runsc does not know (the README's example named
    systrap, which Debian's runsc lacks): every program failed as a platform fault retried at
    once, for ever, and the worker said nothing. It says so at start, and refuses `execute` to
    be retried later, elsewhere, as it refuses sessions it cannot run. The runsc on PATH is a
    fake that refuses every container, as that runsc did: the same on any host."""
    refusing = tmp_path / "runsc"
    refusing.write_text("#!/bin/sh\necho 'fake runsc: no such platform' >&2\nexit 1\n")
    refusing.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    root = session_root()
    settings = Settings(
        sandbox=SandboxSettings(
            backend="gvisor",
            gvisor={"platform": "systrap"},
            workspaces=WorkspaceSettings(root=root, disk="directory"),
        )
    )
    with caplog.at_level(logging.WARNING, logger="tempered.worker"):
        plan = sandbox.build(settings)
    try:
        lines = [r.getMessage() for r in caplog.records if r.name == "tempered.worker"]
        said = [line for line in lines if "no programs" in line]
        assert any("systrap" in line and "fake runsc: no such platform" in line for line in said), (
            lines
        )
        request = ExecuteRequest(run_id="run-g", task_id="code-1", turn=0, items=[])
        with pytest.raises(ApplicationError) as refused:
            await ActivityEnvironment().run(activities(plan)[Activity.EXECUTE.value], request)
        assert_retried_later(refused.value, ErrorType.SANDBOX_INFRA)
        assert "task code-1" in str(refused.value) and "no such platform" in str(refused.value)
    finally:
        assert plan.on_shutdown is not None
        await plan.on_shutdown()
        remove_tree(root)


def on_attempt(attempt: int, after_s: float | None = None) -> ActivityEnvironment:
    """An activity environment whose activity runs as its `attempt`th attempt, scheduled
    `after_s` after its first (default: each refusal `REFUSED_RETRY_S` after the one before)."""
    env = ActivityEnvironment()
    waited = (attempt - 1) * sandbox.REFUSED_RETRY_S if after_s is None else after_s
    first = env.info.scheduled_time
    env.info = dataclasses.replace(
        env.info, attempt=attempt, current_attempt_scheduled_time=first + timedelta(seconds=waited)
    )
    return env


@pytest.mark.asyncio
async def test_refusals_that_last_too_long_fail_the_open_for_good() -> None:
    """Where no sandbox worker can run sessions (the chart's default), an open was refused and
    retried for ever: the run waited with nothing but a pending activity to show it. Once its
    refusals have lasted `REFUSED_FOR_S`, the refusal is final and says what to fix."""
    last = int(sandbox.REFUSED_FOR_S // sandbox.REFUSED_RETRY_S) + 1
    assert 15 * 60 <= sandbox.REFUSED_FOR_S <= 60 * 60 and last > 2
    open_sessions = sandbox.refuse_sessions("bwrap is missing")
    with pytest.raises(ApplicationError) as refused:
        await on_attempt(last - 1).run(open_sessions, REQUEST)
    assert_retried_later(refused.value)
    with pytest.raises(ApplicationError) as soon:  # attempts a second apart (declined restores)
        await on_attempt(last + 5, after_s=last + 5).run(open_sessions, REQUEST)
    assert_retried_later(soon.value)
    with pytest.raises(ApplicationError) as final:
        await on_attempt(last).run(open_sessions, REQUEST)
    error = final.value
    assert error.type == ErrorType.SANDBOX_MISCONFIGURED and error.non_retryable
    assert error.type in NON_RETRYABLE
    assert "no sandbox worker could run workspace sessions for 30 min" in str(error)
    assert "bwrap is missing" in str(error) and "bubblewrap" in str(error)


@pytest.mark.asyncio
async def test_refusals_of_programs_that_last_too_long_fail_the_execute_for_good() -> None:
    """The same for `execute` on workers whose runsc runs no container."""
    last = int(sandbox.REFUSED_FOR_S // sandbox.REFUSED_RETRY_S) + 1
    execute = sandbox.refuse_programs("fake runsc: no such platform")
    request = ExecuteRequest(run_id="run-g", task_id="code-1", turn=0, items=[])
    with pytest.raises(ApplicationError) as refused:
        await on_attempt(last - 1).run(execute, request)
    assert_retried_later(refused.value, ErrorType.SANDBOX_INFRA)
    with pytest.raises(ApplicationError) as final:
        await on_attempt(last).run(execute, request)
    error = final.value
    assert error.type == ErrorType.SANDBOX_MISCONFIGURED and error.non_retryable
    assert "no sandbox worker could run programs for 30 min" in str(error)
    assert "no such platform" in str(error) and "sandbox.gvisor.platform" in str(error)
