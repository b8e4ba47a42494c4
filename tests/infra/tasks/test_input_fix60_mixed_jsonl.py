"""A JSONL suite of code and workspace tasks (`write_jsonl(load_suite("workspace"), …)`, the
documented route): each task validated as its env says, through the real sandbox (bwrap).
Workspace tasks whose trees this host has run in workspaces; the others are not validated
(unjudged), never broken or quarantined (a workspace task's solve.sh run as Python was)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from contracts.common import ObjectRef
from contracts.task import EnvName
from infra.environments.mounts import remove_tree
from infra.settings import SandboxSettings, Settings, WorkspaceSettings
from infra.tasks import load_suite
from infra.tasks.jsonl import write_jsonl
from infra.tasks.validate import CheckPlan, validate_suite
from tests.infra.environments.conftest import needs_root, session_root
from workers.cli import run


def _mixed_suite(path: Path) -> tuple[Path, list[str], list[str], str]:
    """Two starter code tasks, two built-in workspace tasks, one workspace task whose trees
    no one here has (its refs point at nothing)."""
    code = load_suite("starter")[:2]
    workspace = load_suite("workspace")[:3]
    stray = workspace[2]
    assert stray.workspace is not None
    unknown = ObjectRef(key="trees/" + "0" * 64, sha256="0" * 64, size=1)
    stray = stray.model_copy(
        update={
            "id": "stray-workspace-task",
            "workspace": stray.workspace.model_copy(update={"files": unknown}),
        }
    )
    tasks = [*code, *workspace[:2], stray]
    assert {task.env for task in tasks} == {EnvName.CODE, EnvName.WORKSPACE}
    return (
        write_jsonl(tasks, path),
        [task.id for task in code],
        [task.id for task in workspace[:2]],
        stray.id,
    )


@needs_root
def test_workspace_tasks_in_a_jsonl_suite_are_validated_as_workspace_tasks(
    tmp_path: Path,
) -> None:
    suite, code, workspace, stray = _mixed_suite(tmp_path / "mixed.jsonl")
    root = session_root()
    settings = Settings(
        home=tmp_path / "home",
        sandbox=SandboxSettings(workspaces=WorkspaceSettings(root=root)),
    )
    try:
        report = asyncio.run(validate_suite(settings, str(suite), CheckPlan(1, 4)))
    finally:
        remove_tree(root)
    verdicts = {task.task_id: task.verdict for task in report.tasks}
    assert verdicts == dict.fromkeys(code + workspace, "clean"), report.model_dump_json(indent=1)
    assert report.unjudged == [stray]
    assert report.quarantined == []


@needs_root
def test_tasks_validate_quarantines_no_workspace_task_of_a_jsonl_suite(
    tmp_path: Path,
) -> None:
    suite, code, workspace, stray = _mixed_suite(tmp_path / "mixed.jsonl")
    root = session_root()
    home = tmp_path / "home"
    settings = Settings(home=home, sandbox=SandboxSettings(workspaces=WorkspaceSettings(root=root)))
    try:
        code_rc = run(["tasks", "validate", str(suite), "--repeats", "1"], settings)
    finally:
        remove_tree(root)
    assert code_rc == 0
    (listing,) = (home / "quarantine").glob("mixed-*.json")
    document = json.loads(listing.read_text())
    assert document["quarantined"] == [] and document["broken"] == []
    assert document["unjudged"] == [stray]


def test_a_suite_file_under_tilde_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tasks ls '~/x.jsonl'` said "no such task file" where `train --suite` expands `~`."""
    monkeypatch.setenv("HOME", str(tmp_path))
    write_jsonl(load_suite("starter")[:3], tmp_path / "x.jsonl")
    assert [task.id for task in load_suite("~/x.jsonl")] == [
        task.id for task in load_suite("starter")[:3]
    ]
    assert run(["tasks", "ls", "~/x.jsonl", "--json"], Settings(home=tmp_path / "home")) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
