"""With workspace sessions on, the sandbox worker's pod holds its commands: rendering fails
unless its memory limit holds `sandbox.concurrency` of them at once, each up to
`sandbox.workspaces.max_task_memory_mb`, its /tmp and /dev/shm tmpfs (a run's `tmpfs_mb`) and its
session's workspace tmpfs (`max_workspace_mb`, with `sandbox.workspaceSessions.disk` tmpfs).

The defaults (1Gi, 16 × 4096 MB) once rendered, and so did the README's "Turning it on": the
pod was OOM-killed, every session with it, once a few commands ran. Each rendered set is read
back through the settings model here, so the chart's sum is checked against what the workers
load. Skipped without helm.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from contracts.task import SandboxLimits
from infra.settings import Settings, WorkspaceSettings
from tests.charts.chart import (
    CHART,
    CI_VALUES,
    container,
    deployments,
    needs_helm,
    refused,
    render,
    settings_from,
    value_set_id,
    worker_env,
)

pytestmark = needs_helm

MIB = 2**20
TMPFS_MB: int = SandboxLimits.model_fields["tmpfs_mb"].default
SESSIONS = "sandbox.workspaceSessions.enabled=true"
TASK = "TEMPERED_SANDBOX__WORKSPACES__MAX_TASK_MEMORY_MB"
WORKSPACE = "TEMPERED_SANDBOX__WORKSPACES__MAX_WORKSPACE_MB"


def needed_mib(settings: Settings, disk: str) -> int:
    """What the sandbox worker's commands may hold at once, from the settings it loads."""
    ws = settings.sandbox.workspaces
    workspace = ws.max_workspace_mb if disk == "tmpfs" else 0
    return settings.sandbox.concurrency * (ws.max_task_memory_mb + 2 * TMPFS_MB + workspace)


def limit_mib(docs: list[dict[str, Any]]) -> float:
    memory = str(container(deployments(docs)["sandbox"])["resources"]["limits"]["memory"])
    number, unit = re.fullmatch(r"([0-9.]+)(Mi|Gi|Ti)", memory).groups()  # type: ignore[union-attr]
    return float(number) * {"Mi": 1, "Gi": 1024, "Ti": 1024**2}[unit]


def sandbox_settings(docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> Settings:
    return settings_from(worker_env(docs, "sandbox"), monkeypatch)


def test_the_defaults_with_sessions_on_are_refused_naming_the_numbers() -> None:
    refusal = refused(SESSIONS)
    for words in (
        "workers.sandbox.resources.limits.memory 1Gi",
        "sandbox.concurrency 16",
        "max_task_memory_mb 4096",
        f"tmpfs_mb {TMPFS_MB}",
        "max_workspace_mb 256",
        f"{16 * (4096 + 2 * TMPFS_MB + 256)}Mi",
    ):
        assert words in refusal, refusal


def with_sessions(values: Path) -> bool:
    sandbox = (yaml.safe_load(values.read_text()) or {}).get("sandbox") or {}
    return bool((sandbox.get("workspaceSessions") or {}).get("enabled"))


SESSION_SETS = [values for values in CI_VALUES if with_sessions(values)]


@pytest.mark.parametrize("values", SESSION_SETS, ids=value_set_id)
def test_every_value_set_with_sessions_holds_its_commands(
    values: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(values)
    disk = worker_env(docs, "sandbox")["TEMPERED_SANDBOX__WORKSPACES__DISK"]
    assert limit_mib(docs) >= needed_mib(sandbox_settings(docs, monkeypatch), disk)


def readme_turning_it_on() -> list[str]:
    """The `--set` items of the README's command under **Turning it on**."""
    readme = (CHART / "README.md").read_text()
    section = readme[readme.index("**Turning it on**") :]
    block = section[section.index("```sh") : section.index("```", section.index("```sh") + 5)]
    return re.findall(r"--set\s+(\S+)", block)


def test_the_readmes_turning_it_on_renders_a_pod_that_holds_its_commands(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sets = readme_turning_it_on()
    assert SESSIONS in sets
    docs = render(None, *sets)
    settings = sandbox_settings(docs, monkeypatch)
    assert limit_mib(docs) >= needed_mib(settings, "tmpfs")


@pytest.mark.parametrize(
    ("sets", "needed"),
    [
        # 2 x (1000 + 2 x 64 + 100): from settings:
        ((f"settings.{TASK}=1000", f"settings.{WORKSPACE}=100"), 2 * (1000 + 128 + 100)),
        # the sandbox worker's env wins over settings:, as in the pod
        (
            (
                f"settings.{TASK}=1000",
                f"workers.sandbox.env.{TASK}=500",
                f"defaults.env.{WORKSPACE}=100",
            ),
            2 * (500 + 128 + 100),
        ),
        # a directory workspace is on the emptyDir, not in memory
        ((f"settings.{TASK}=1000", "sandbox.workspaceSessions.disk=directory"), 2 * (1000 + 128)),
        # the model's defaults where nothing sets them
        ((), 2 * (4096 + 128 + 256)),
    ],
)
def test_the_limit_must_hold_the_sum_exactly(
    sets: tuple[str, ...], needed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = (SESSIONS, "sandbox.concurrency=2", *sets)
    docs = render(None, *base, f"workers.sandbox.resources.limits.memory={needed}Mi")
    disk = worker_env(docs, "sandbox")["TEMPERED_SANDBOX__WORKSPACES__DISK"]
    assert needed_mib(sandbox_settings(docs, monkeypatch), disk) == needed
    refusal = refused(*base, f"workers.sandbox.resources.limits.memory={needed - 1}Mi")
    assert f"= {needed}Mi" in refusal, refusal


def test_a_pod_without_a_memory_limit_is_not_refused() -> None:
    """Nothing bounds it but the node: there is no limit to size."""
    docs = render(
        None, SESSIONS, "defaults.resources.limits=null", "workers.sandbox.resources.limits=null"
    )
    assert "memory" not in container(deployments(docs)["sandbox"])["resources"].get("limits", {})


def test_the_charts_defaults_are_the_models() -> None:
    """The chart knows the defaults it sums where nothing sets them (templates/_sessions.tpl,
    tempered.workspaceDefaults): the model's and the contract's."""
    text = (CHART / "templates" / "_sessions.tpl").read_text()
    block = re.search(r'define "tempered.workspaceDefaults" -\}\}\n(.*?)\{\{- end', text, re.S)
    assert block, "no tempered.workspaceDefaults"
    assert yaml.safe_load(block[1]) == {
        TASK: WorkspaceSettings.model_fields["max_task_memory_mb"].default,
        WORKSPACE: WorkspaceSettings.model_fields["max_workspace_mb"].default,
        "tmpfs_mb": TMPFS_MB,
    }
