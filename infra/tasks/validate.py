"""Validate a task suite through the real sandbox and write its quarantine list.

For every task the canonical solution runs `repeats` times and the wrong solution once, all
at bounded concurrency through one sandbox backend. A task is

- **broken** when its canonical solution never passes, or one of its runs is fatal (training
  would fail on it: a workspace task's untouched tree whose check raises the task's error),
- **flaky** when it passes on some repeats and not others,
- **weak** when its wrong solution passes (the tests would reward a wrong program),
- **infra** when a run still hit a platform failure (`SandboxInfraError` or status
  `infra_error`) after the offline retries of `contracts.errors.INFRA_RETRY` (through
  `infra/sandbox/retrying.py`) — the task is not judged then, and never counted as broken.

A task with nothing to validate with (a Harbor task without solution/solve.sh, a JSONL file's
workspace task whose trees this host does not have) has no runs and no verdict: the report lists
it as **unjudged**, never quarantined. Each task is validated as its env says (`TaskSpec.env`): a
JSONL file may hold code and workspace tasks, and a workspace task's solve.sh run as Python was
always broken.

Broken, flaky and weak tasks are quarantined: `<home>/quarantine/<key>.json` (`suite_key`) lists
them and training skips them (`infra.tasks.load_quarantine`). The verdicts, the report and the
driver (`run_checks`, given each task's runs as `TaskRuns`) are shared with workspace suites
(`workspace_validate.py`), which differ only in how one run goes. Run it as

    tempered tasks validate humaneval --repeats 5 --concurrency 8
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, computed_field

from contracts.errors import INFRA_RETRY, Backoff
from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import EnvName, SandboxLimits, TaskSpec
from infra.sandbox import get_backend
from infra.sandbox.base import SandboxBackend
from infra.sandbox.retrying import run_retrying
from infra.tasks import load_suite, quarantine_path, workspace_trees

if TYPE_CHECKING:
    from infra.settings import Settings

VALIDATION_LIMITS = SandboxLimits(timeout_s=30.0)
"""Training's limits, except a 30 s wall deadline (training: 10 s). CPU time (10 s), memory and
processes stay as in training, so a genuinely slow or hungry canonical solution still fails;
only the wall clock, which on a loaded host measures contention rather than the task (HumanEval
at C=8 on 2 busy cores: slowest canonical run 5.5 s wall for ~0.3 s of CPU), gets headroom."""
log = logging.getLogger("tempered.tasks")


class RunRecord(BaseModel):
    """Outcome of one program run; `status` None means every attempt hit an infra failure."""

    status: ExecStatus | None
    duration_ms: int = 0
    infra_retries: int = 0
    detail: str = ""
    fatal: bool = False
    """A run that training would fail on (the task's error where a score was due: a workspace
    task's untouched tree whose verify raised `InvalidTask`): its task is broken."""


class TaskCheck(BaseModel):
    """All runs of one task and the verdict drawn from them."""

    task_id: str
    canonical: list[RunRecord]
    wrong: RunRecord | None = None  # None: the task has no wrong solution to check

    @computed_field  # type: ignore[prop-decorator]
    @property
    def verdict(self) -> str:
        """clean | broken | flaky | weak | infra (broken/flaky win over weak)."""
        runs = self.canonical + ([self.wrong] if self.wrong else [])
        if any(run.status is None for run in runs):
            return "infra"
        passes = sum(run.status == ExecStatus.PASSED for run in self.canonical)
        if passes == 0 or any(run.fatal for run in runs):
            return "broken"
        if passes < len(self.canonical):
            return "flaky"
        if self.wrong is not None and self.wrong.status == ExecStatus.PASSED:
            return "weak"
        return "clean"


class ValidationReport(BaseModel):
    suite: str
    backend: str
    repeats: int
    concurrency: int
    limits: SandboxLimits
    created_at: str
    wall_s: float
    tasks: list[TaskCheck]
    unjudged: list[str] = []  # tasks with nothing to validate with: no runs, no verdict

    def ids(self, verdict: str) -> list[str]:
        return [task.task_id for task in self.tasks if task.verdict == verdict]

    @property
    def quarantined(self) -> list[str]:
        return sorted(set(self.ids("broken")) | set(self.ids("flaky")) | set(self.ids("weak")))

    @property
    def runs(self) -> int:
        return sum(len(task.canonical) + (task.wrong is not None) for task in self.tasks)

    @property
    def infra_retries(self) -> int:
        records = [
            run
            for task in self.tasks
            for run in task.canonical + ([task.wrong] if task.wrong else [])
        ]
        return sum(run.infra_retries for run in records)

    def quarantine_document(self) -> dict[str, object]:
        return {
            "suite": self.suite,
            "created_at": self.created_at,
            "repeats": self.repeats,
            "backend": self.backend,
            "tasks": len(self.tasks),
            "broken": self.ids("broken"),
            "flaky": self.ids("flaky"),
            "weak": self.ids("weak"),
            "infra": self.ids("infra"),
            "no_wrong_solution": [task.task_id for task in self.tasks if task.wrong is None],
            "unjudged": self.unjudged,
            "quarantined": self.quarantined,
        }


@dataclass(frozen=True)
class CheckPlan:
    """How a suite is checked, whatever its kind: each canonical solution `repeats` times,
    at most `concurrency` runs at a time, under `limits`; `on_run()` after each run (progress)."""

    repeats: int = 5
    concurrency: int = 8
    limits: SandboxLimits = field(default_factory=lambda: VALIDATION_LIMITS)
    on_run: Callable[[], None] | None = None


@dataclass(frozen=True)
class TaskRuns:
    """One task as `run_checks` sees it: how to run each of its programs once."""

    task_id: str
    canonical: Callable[[], Awaitable[RunRecord]]
    wrong: Callable[[], Awaitable[RunRecord]] | None = None  # None: no wrong solution to check


async def run_checks(
    tasks: list[TaskRuns],
    plan: CheckPlan,
    *,
    suite: str,
    backend: str,
    unjudged: list[str] | None = None,
) -> ValidationReport:
    """The driver of every suite: each task's canonical run `plan.repeats` times and its wrong
    run once, all tasks at once but at most `plan.concurrency` runs at a time. `unjudged`: the
    tasks with nothing to run, reported as such."""
    repeats, on_run = plan.repeats, plan.on_run
    if repeats < 1 or plan.concurrency < 1:
        raise ValueError("repeats and concurrency must be at least 1")
    gate = asyncio.Semaphore(plan.concurrency)

    async def one(run: Callable[[], Awaitable[RunRecord]]) -> RunRecord:
        async with gate:
            record = await run()
        if on_run is not None:
            on_run()
        return record

    async def check(task: TaskRuns) -> TaskCheck:
        wrong = [one(task.wrong)] if task.wrong else []
        records = await asyncio.gather(*(one(task.canonical) for _ in range(repeats)), *wrong)
        return TaskCheck(
            task_id=task.task_id,
            canonical=records[:repeats],
            wrong=records[repeats] if wrong else None,
        )

    created_at = datetime.now(UTC).isoformat(timespec="seconds")
    started = time.perf_counter()
    checks = await asyncio.gather(*(check(task) for task in tasks))
    return ValidationReport(
        suite=suite,
        backend=backend,
        repeats=repeats,
        concurrency=plan.concurrency,
        limits=plan.limits,
        created_at=created_at,
        wall_s=round(time.perf_counter() - started, 2),
        tasks=checks,
        unjudged=sorted(unjudged or []),
    )


async def _run_once(
    backend: SandboxBackend,
    program: str,
    task: TaskSpec,
    limits: SandboxLimits,
    backoff: Backoff,
) -> RunRecord:
    """One program against `task.tests` and `task.hidden_tests`; platform failures are retried,
    never a verdict."""
    attempted = await run_retrying(
        backend,
        program,
        task.tests,
        limits,
        task.entry_point,
        helpers=task.helpers,
        hidden_tests=task.hidden_tests,
        backoff=backoff,
    )
    result = attempted.result
    if result is None:
        return RunRecord(
            status=None, infra_retries=attempted.infra_retries, detail=attempted.detail
        )
    failure = "" if result.status == ExecStatus.PASSED else _failure(result)
    return RunRecord(
        status=result.status,
        duration_ms=result.duration_ms,
        infra_retries=attempted.infra_retries,
        detail=failure,
    )


def _failure(result: ExecutionResult) -> str:
    """A one-line reason: the backend's detail and the last lines of stderr (the failed assert)."""
    lines = [result.detail, *result.stderr.splitlines()[-3:]]
    parts = dict.fromkeys(line.strip() for line in lines if line.strip())  # ordered, no repeats
    return f"{result.status}: " + " | ".join(parts)


async def validate_tasks(
    tasks: list[TaskSpec],
    backend: SandboxBackend,
    plan: CheckPlan,
    *,
    suite: str,
    backoff: Backoff = INFRA_RETRY,
) -> ValidationReport:
    """Run every code task's canonical solution `plan.repeats` times and its wrong solution
    once. Tasks of other envs are not run (a workspace task's solve.sh is no Python program):
    the report lists them as unjudged."""
    others = [task.id for task in tasks if task.env is not EnvName.CODE]
    tasks = [task for task in tasks if task.env is EnvName.CODE]
    missing = [task.id for task in tasks if not task.canonical_solution]
    if missing:
        raise ValueError(f"tasks without a canonical_solution cannot be validated: {missing[:5]}")

    def run(program: str, task: TaskSpec) -> Callable[[], Awaitable[RunRecord]]:
        return partial(_run_once, backend, program, task, plan.limits, backoff)

    runs = [
        TaskRuns(
            task.id,
            canonical=run(task.canonical_solution or "", task),
            wrong=run(task.wrong_solution, task) if task.wrong_solution else None,
        )
        for task in tasks
    ]
    return await run_checks(runs, plan, suite=suite, backend=backend.name, unjudged=others)


CATEGORIES = ("broken", "flaky", "weak", "infra", "no_wrong_solution", "unjudged", "quarantined")


def read_quarantine(settings: Settings, suite: str) -> dict[str, list[str]]:
    """The quarantine list last written for `suite`, by category ({} when there is none).

    ValueError naming the file when it is not one. `tempered tasks validate` reads it before
    any run starts: it was read only to be merged, after every task had run, and a malformed
    file failed there with "Expecting value: line 1 column 1", naming no file, the results lost.
    """
    path = quarantine_path(settings, suite)
    if not path.is_file():
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(document, dict):
            raise ValueError(f"a JSON {type(document).__name__}, not an object")
        lists = {category: document.get(category, []) for category in CATEGORIES}
        for category, ids in lists.items():
            if not isinstance(ids, list):
                raise ValueError(f"{category!r} is not a list")
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError too
        raise ValueError(f"{path}: not a quarantine list ({exc})") from None
    return {category: [str(task_id) for task_id in ids] for category, ids in lists.items()}


def write_quarantine(
    settings: Settings, report: ValidationReport, *, replace: bool = False
) -> Path:
    """Write the report's quarantine list where training looks for it (atomic rename).

    A report that covers only part of the suite (`--split`, `--limit`) keeps the earlier
    entries of the tasks it did not check, so a partial run never un-quarantines anything
    (ValueError naming the file when the earlier list cannot be read: `read_quarantine`).
    `replace`: the report covers the whole suite, and whatever the file held is dropped.
    """
    path = quarantine_path(settings, report.suite)
    document = report.quarantine_document()
    # an unjudged task was looked at too: its earlier entries go, as a whole-suite run drops them
    checked = {task.task_id for task in report.tasks} | set(report.unjudged)
    previous = {} if replace else read_quarantine(settings, report.suite)
    for category, ids in previous.items():
        kept = [task_id for task_id in ids if task_id not in checked]
        current = document[category]
        assert isinstance(current, list)
        document[category] = sorted(set(kept) | set(current))
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(path.name + ".tmp")
    staging.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    staging.replace(path)
    return path


async def validate_suite(
    settings: Settings,
    suite: str,
    plan: CheckPlan,
    *,
    backend_name: str | None = None,
    split: str | None = None,
    limit: int | None = None,
) -> ValidationReport:
    """Load `suite`, validate it through the configured sandbox backend, close the backend.
    Its workspace tasks (a JSONL file's) run in workspaces on this host where it has their
    trees (`workspace_trees`), after the code tasks; the others are logged and unjudged."""
    tasks = load_suite(suite, split=split)[:limit]
    found, not_here = workspace_trees(tasks)
    for task_id in not_here:
        log.warning("unjudged: %s: its workspace trees are not on this host", task_id)
    backend = get_backend(settings, backend_name)
    try:
        report = await validate_tasks(tasks, backend, plan, suite=suite)
        if not found:
            return report
        from infra.tasks.workspace_validate import validate_workspace_tasks_here  # imports us

        more = await validate_workspace_tasks_here(settings, found, backend, plan, suite=suite)
    finally:
        await backend.close()
    judged = {task.spec.id for task in found} - set(more.unjudged)
    return report.model_copy(
        update={
            "tasks": report.tasks + more.tasks,
            "unjudged": sorted(set(report.unjudged) - judged),
            "wall_s": round(report.wall_s + more.wall_s, 2),
        }
    )
