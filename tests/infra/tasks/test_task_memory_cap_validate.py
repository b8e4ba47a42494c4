"""`tempered tasks validate` runs a task's solution and check within the operator's cap on a
task's memory (`sandbox.workspaces.max_task_memory_mb`), as a sandbox worker does, and warns
once of a task asking more; the loader says so of a task asking more than the default cap."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from infra.environments.mounts import remove_tree
from infra.settings import SandboxSettings, Settings, WorkspaceSettings
from infra.tasks.harbor import load_task
from infra.tasks.validate import CheckPlan
from infra.tasks.workspace_validate import validate_workspace_suite
from tests.infra.environments.conftest import needs_root, session_root
from tests.infra.tasks.test_harbor_review_validate import harbor_task

REWARD = "/logs/verifier/reward.txt"
TEST = f'if [ "$(cat /app/out.txt)" = ok ]; then echo 1; else echo 0; fi > {REWARD}\n'


def solving_with(mb: int) -> str:
    allocate = f"python3 -c 'b = b\"x\" * ({mb} << 20)'"
    return f"#!/bin/bash\n{allocate} > /dev/null && echo ok > /app/out.txt\n"


def task(tmp_path: Path, name: str, memory: str, solve_mb: int) -> None:
    harbor_task(tmp_path, name, TEST)
    (tmp_path / name / "task.toml").write_text(
        f"[verifier]\ntimeout_sec = 30.0\n[environment]\n{memory}\n"
    )
    (tmp_path / name / "solution" / "solve.sh").write_text(solving_with(solve_mb))


def validate(tmp_path: Path, cap: int) -> str:
    root = session_root()
    assert root.name.startswith("tempered-test-sessions-")
    workspaces = WorkspaceSettings(root=root, max_task_memory_mb=cap)
    settings = Settings(sandbox=SandboxSettings(workspaces=workspaces))
    try:
        report = asyncio.run(
            validate_workspace_suite(settings, f"harbor:{tmp_path}", CheckPlan(1, 1))
        )
    finally:
        remove_tree(root)
    (check,) = report.tasks
    return check.verdict


@needs_root
def test_the_oracle_of_a_task_asking_8192_mb_runs_under_the_cap(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    task(tmp_path, "greedy", "memory_mb = 8192", 1200)
    with caplog.at_level(logging.WARNING):
        assert validate(tmp_path, 1024) == "broken"  # 1200 MB past the cap of 1024
    lines = [r.getMessage() for r in caplog.records if "max_task_memory_mb" in r.getMessage()]
    capped = [line for line in lines if "1024 MB" in line]
    assert len(capped) == 1 and "greedy" in capped[0] and "8192 MB" in capped[0], lines


@needs_root
def test_within_the_cap_the_tasks_memory_holds(tmp_path: Path) -> None:
    task(tmp_path, "modest", "memory_mb = 8192", 700)
    assert validate(tmp_path, 1024) == "clean"  # capped, not refused


def test_a_task_asking_more_than_the_default_cap_is_warned_of_at_load(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for name, memory in (("big", "memory_mb = 8192"), ("old", 'memory = "8G"')):
        task(tmp_path, name, memory, 1)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="tempered.tasks"):
            load_task(tmp_path / name, suite="harbor:x")
        (line,) = [r.getMessage() for r in caplog.records if "8192" in r.getMessage()]
        assert f"task {name}" in line and "max_task_memory_mb" in line and "4096" in line, line


def test_a_task_within_the_default_cap_is_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    task(tmp_path, "fits", "memory_mb = 4096", 1)
    with caplog.at_level(logging.WARNING, logger="tempered.tasks"):
        load_task(tmp_path / "fits", suite="harbor:x")
    assert not [r for r in caplog.records if "memory" in r.getMessage()], caplog.records
