"""Validate a `workspace` suite (built-in or Harbor): solutions solve, untouched workspaces don't.

For every task, `repeats` fresh sessions each run the reference solution (Harbor's oracle:
`bash /solution/solve.sh` in the workspace) and are verified; each must score 1.0. One more
session is verified untouched and must score below 1.0. The driver, the verdicts and the
quarantine list are `infra/tasks/validate.py`'s (solution runs are its canonical runs, the
untouched workspace its wrong solution: broken, flaky, weak, infra, clean); this module says
only how one run goes. A Harbor task directory that cannot be loaded is broken, its runs the
load error, and so is a task whose initial tree does not fit a workspace (`TreeError`) or whose
check cannot work (`InvalidTask`): that task's verdict, never the suite's end. So is a task
whose untouched workspace's check raises `InvalidTask` (a script exiting 0 without a reward:
training would fail on it; a fatal run) or whose script exits non-zero on its solution (a
reward counts only from a script that exits 0: `infra/environments/checks.py`). A task without
a solution (Harbor's solution/ is optional) is not judged: it is logged and reported as
unjudged (never quarantined), and the others are validated. Everything runs on this host, with
the trees in memory: no object store, no Temporal.

    report = await validate_workspace_suite(settings, "harbor:examples/harbor", CheckPlan(5))
    tempered tasks validate workspace --repeats 5
"""

from __future__ import annotations

import itertools
import logging
import time
from functools import partial

from tenacity import RetryError

from contracts.sandbox import ExecStatus
from contracts.task import SandboxLimits
from infra.environments.check_limits import task_limits
from infra.environments.checks import InvalidTask
from infra.environments.sessions import SessionHost
from infra.environments.snapshots import MemoryObjects, Trees
from infra.environments.tree import TreeError
from infra.environments.workspace import WorkspaceEnvironment
from infra.sandbox import get_backend
from infra.sandbox.base import SandboxBackend, SandboxInfraError
from infra.sandbox.retrying import offline_retrying
from infra.sandbox.workspace import CommandRunner
from infra.settings import Settings
from infra.tasks import workspace_suite_and_errors
from infra.tasks.validate import (
    CheckPlan,
    RunRecord,
    TaskRuns,
    ValidationReport,
    run_checks,
)
from infra.tasks.workspace_task import WorkspaceTask

_ids = itertools.count()
log = logging.getLogger("tempered.tasks")


async def _attempt(
    env: WorkspaceEnvironment, task: WorkspaceTask, solve: bool, limits: SandboxLimits
) -> RunRecord:
    """One session: reset, the solution if `solve`, verify, close. Platform faults raise; the
    task's own (a check that cannot work, a tree that does not fit a workspace) are its run's
    error, fatal for the untouched workspace: training's verify fails the run on it
    (activities/environment.py), so the task is broken, not clean."""
    workspace = task.spec.workspace
    assert workspace is not None
    session_id = f"validate-{next(_ids)}"
    started = time.perf_counter()
    try:
        state = await env.reset(workspace, session_id)
        cap = env.host.config.max_task_memory_mb  # as a sandbox worker caps it, its check too
        limits = task_limits(workspace, limits, cap, task.spec.id)
        if solve:
            assert task.solution is not None
            state, seen = await env.solve(state, task.solution.ref, limits)
            if seen.status is not ExecStatus.PASSED:
                return RunRecord(status=ExecStatus.FAILED, detail=f"solve.sh: {seen.text[-300:]}")
        graded = await env.verify(workspace, state, limits)
    except (InvalidTask, TreeError) as exc:
        if solve:
            return RunRecord(status=ExecStatus.ERROR, detail=str(exc))
        detail = f"the untouched workspace: {exc}; training would fail on it"
        return RunRecord(status=ExecStatus.ERROR, detail=detail, fatal=True)
    finally:
        await env.close([session_id])
    result = graded.result
    if graded.score >= 1.0:
        status, detail = ExecStatus.PASSED, ""
    else:  # scored below 1.0: its own status unless that says passed
        status = result.status if result.status is not ExecStatus.PASSED else ExecStatus.FAILED
        detail = f"score {graded.score:g}: {result.detail} {result.stderr[-200:]}".strip()
    duration_ms = int((time.perf_counter() - started) * 1000)
    return RunRecord(status=status, duration_ms=duration_ms, detail=detail)


async def _retrying(
    env: WorkspaceEnvironment, task: WorkspaceTask, solve: bool, limits: SandboxLimits
) -> RunRecord:
    """`_attempt`, with platform faults retried as offline paths do (`INFRA_RETRY`)."""
    faults: list[str] = []
    retrying = offline_retrying(
        SandboxInfraError,
        before_sleep=lambda state: faults.append(
            str(state.outcome.exception() if state.outcome else "")
        ),
    )
    try:
        record: RunRecord = await retrying(_attempt, env, task, solve, limits)
    except RetryError as exc:
        return RunRecord(
            status=None, infra_retries=len(faults), detail=str(exc.last_attempt.exception())
        )
    return record.model_copy(update={"infra_retries": len(faults)})


async def _unloadable(error: str) -> RunRecord:
    """The run of a task directory that could not be loaded: an error, named by its file."""
    return RunRecord(status=ExecStatus.ERROR, detail=f"cannot load: {error}")


async def validate_workspace_tasks(
    tasks: list[WorkspaceTask],
    env: WorkspaceEnvironment,
    plan: CheckPlan,
    *,
    suite: str,
    unloadable: dict[str, str] | None = None,
) -> ValidationReport:
    """Run every task's solution in `plan.repeats` fresh sessions; verify one untouched session.
    `unloadable` (task name: why it could not be loaded) are reported as broken; tasks without
    a solution are logged and reported as unjudged."""
    unjudged = [task.spec.id for task in tasks if task.solution is None]
    for task_id in unjudged:
        log.warning("unjudged: %s: no solution to validate with (solution/solve.sh)", task_id)
    runs = [
        TaskRuns(
            task.spec.id,
            canonical=partial(_retrying, env, task, True, plan.limits),
            wrong=partial(_retrying, env, task, False, plan.limits),
        )
        for task in tasks
        if task.solution is not None
    ]
    runs += [
        TaskRuns(name, canonical=partial(_unloadable, error))
        for name, error in (unloadable or {}).items()
    ]
    return await run_checks(runs, plan, suite=suite, backend=env.backend.name, unjudged=unjudged)


async def validate_workspace_suite(
    settings: Settings,
    suite: str,
    plan: CheckPlan,
    *,
    backend_name: str | None = None,
    split: str | None = None,
    limit: int | None = None,
) -> ValidationReport:
    """Load a workspace suite and validate it on this host (trees in memory). A Harbor task
    directory that cannot be loaded is `broken` (its runs the load error): it was logged and
    left out, and a suite with one exited 0, all clean."""
    tasks, unloadable = workspace_suite_and_errors(suite, split=split)
    backend = get_backend(settings, backend_name)
    try:
        return await validate_workspace_tasks_here(
            settings, tasks[:limit], backend, plan, suite=suite, unloadable=unloadable
        )
    finally:
        await backend.close()


async def validate_workspace_tasks_here(
    settings: Settings,
    tasks: list[WorkspaceTask],
    backend: SandboxBackend,
    plan: CheckPlan,
    *,
    suite: str,
    unloadable: dict[str, str] | None = None,
) -> ValidationReport:
    """`validate_workspace_tasks` on this host, the tasks' trees in memory (`backend` stays
    open: the caller's)."""
    objects = MemoryObjects()
    for task in tasks:
        objects.update(task.objects)
        if task.solution is not None:
            objects.update(task.solution.objects)
    trees = Trees(objects)
    host = SessionHost(settings.sandbox.workspaces)
    env = WorkspaceEnvironment(host, trees, CommandRunner(), backend)
    try:
        return await validate_workspace_tasks(tasks, env, plan, suite=suite, unloadable=unloadable)
    finally:
        await host.shutdown()
        trees.close()
