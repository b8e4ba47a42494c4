"""`tempered tasks validate` runs a Harbor task's solve.sh within the task's stated memory
(`[environment] memory_mb`, `WorkspaceSpec.limits_of`), as training runs its steps: the oracle
ran under the run's 512 MB, and a task whose solution needs 700 MB was called broken."""

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
SOLVE = (
    "#!/bin/bash\n"
    "python3 -c 'b = b\"x\" * (700 << 20); print(len(b) >> 20)' > /dev/null && echo ok > /app/out.txt\n"
)


@needs_root
def test_the_oracle_runs_within_the_tasks_memory(tmp_path: Path) -> None:
    harbor_task(tmp_path, "big", TEST)
    (tmp_path / "big" / "task.toml").write_text(
        "[verifier]\ntimeout_sec = 30.0\n[environment]\nmemory_mb = 1024\n"
    )
    (tmp_path / "big" / "solution" / "solve.sh").write_text(SOLVE)
    root = session_root()
    settings = Settings(sandbox=SandboxSettings(workspaces=WorkspaceSettings(root=root)))
    try:
        report = asyncio.run(
            validate_workspace_suite(settings, f"harbor:{tmp_path}", CheckPlan(1, 1))
        )
    finally:
        remove_tree(root)
    (check,) = report.tasks
    assert check.verdict == "clean", check


def test_a_dockerfile_env_is_said_not_to_reach_the_check(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Harbor's test.sh inherits the image's ENV; Tempered's check does not (a PATH or HOME into
    the workspace let the agent's files forge the reward): a task relying on it failed its
    check with no word at load."""
    harbor_task(tmp_path, "env", TEST)
    dockerfile = tmp_path / "env" / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "ENV PYTHONPATH=/app/src TOOL=x QUIET=1\n")
    test = tmp_path / "env" / "tests" / "test.sh"
    test.write_text(test.read_text() + "echo ${TOOL}\n")  # QUIET: unused, not said
    with caplog.at_level(logging.WARNING, logger="tempered.tasks"):
        load_task(tmp_path / "env", suite="harbor:x")
    (line,) = [r.getMessage() for r in caplog.records if "ENV" in r.getMessage()]
    assert "ENV PYTHONPATH, TOOL:" in line and "[verifier.env]" in line, line


def test_an_env_the_verifier_env_gives_is_not_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Set in [verifier.env] as the warning asks: no warning for it any more."""
    harbor_task(tmp_path, "given", TEST)
    dockerfile = tmp_path / "given" / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "ENV TOOL=x\n")
    (tmp_path / "given" / "tests" / "test.sh").write_text(f"#!/bin/bash\necho $TOOL\n{TEST}")
    toml = tmp_path / "given" / "task.toml"
    toml.write_text(toml.read_text() + 'env = { TOOL = "x" }\n')
    with caplog.at_level(logging.WARNING, logger="tempered.tasks"):
        load_task(tmp_path / "given", suite="harbor:x")
    assert not [r for r in caplog.records if "ENV" in r.getMessage()], caplog.text
