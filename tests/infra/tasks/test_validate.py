"""`tempered tasks validate` through the real local sandbox (bwrap): verdicts and quarantine."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from contracts.errors import Backoff
from contracts.sandbox import ExecutionResult
from contracts.task import SandboxLimits, TaskSpec
from infra.sandbox import SandboxBackend, SandboxInfraError, get_backend
from infra.settings import Settings
from infra.tasks import load_quarantine, load_suite
from infra.tasks.validate import CheckPlan, validate_tasks, write_quarantine
from workers.cli import run

FAST_RETRY = Backoff(initial_s=0.01, coefficient=2.0, max_s=0.05, offline_attempts=3)
DEFAULT_LIMITS = SandboxLimits()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(home=tmp_path / "home")


@pytest_asyncio.fixture
async def backend(settings: Settings) -> AsyncIterator[SandboxBackend]:
    sandbox = get_backend(settings, "local")
    try:
        yield sandbox
    finally:
        await sandbox.close()


class FlakyPlatform:
    """The real backend behind injected platform faults: the first `faults` runs raise."""

    def __init__(self, inner: SandboxBackend, faults: int) -> None:
        self.inner, self.faults, self.name, self.calls = inner, faults, inner.name, 0

    async def run(
        self,
        program: str,
        tests: str = "",
        limits: SandboxLimits = DEFAULT_LIMITS,
        entry_point: str | None = None,
        helpers: str = "",
        hidden_tests: str = "",
    ) -> ExecutionResult:
        self.calls += 1
        if self.calls <= self.faults:
            raise SandboxInfraError(f"injected platform fault {self.calls}")
        return await self.inner.run(program, tests, limits, entry_point, helpers, hidden_tests)

    async def close(self) -> None:
        await self.inner.close()


def sample_tasks() -> list[TaskSpec]:
    """Ten starter tasks from ten families and five HumanEval tasks."""
    return load_suite("starter")[::16] + load_suite("humaneval")[:5]


def broken_and_weak(template: TaskSpec) -> list[TaskSpec]:
    canonical, tests = template.canonical_solution or "", template.tests
    broken = template.model_copy(
        update={
            "id": "deliberately-broken",
            "canonical_solution": canonical.replace("return", "return -1 +", 1),
        }
    )
    weak = template.model_copy(
        update={
            "id": "deliberately-weak",
            "tests": "def check(candidate):\n    assert candidate is not None\n",
            "hidden_tests": "",  # a starter task's hidden asserts would still reject it
        }
    )
    assert broken.canonical_solution != canonical and weak.tests != tests
    return [broken, weak]


@pytest.mark.asyncio
async def test_validate_flags_broken_and_weak_and_passes_good_tasks(
    backend: SandboxBackend, settings: Settings
) -> None:
    good = sample_tasks()
    tasks = good + broken_and_weak(good[0])
    report = await validate_tasks(tasks, backend, CheckPlan(2, 4), suite="starter")
    verdicts = {task.task_id: task.verdict for task in report.tasks}
    assert verdicts == {
        **{t.id: "clean" for t in good},
        "deliberately-broken": "broken",
        "deliberately-weak": "weak",
    }
    assert report.runs == len(tasks) * 3 and report.wall_s > 0
    broken = next(t for t in report.tasks if t.task_id == "deliberately-broken")
    assert [run.status for run in broken.canonical] == ["failed", "failed"]
    path = write_quarantine(settings, report)
    document = json.loads(path.read_text())
    assert document["broken"] == ["deliberately-broken"] and document["weak"] == [
        "deliberately-weak"
    ]
    assert document["repeats"] == 2 and document["suite"] == "starter"
    assert load_quarantine(settings, "starter") == {"deliberately-broken", "deliberately-weak"}


@pytest.mark.asyncio
async def test_partial_revalidation_keeps_other_quarantined_tasks(
    backend: SandboxBackend, settings: Settings
) -> None:
    good = load_suite("starter")[:2]
    tasks = good + broken_and_weak(good[0])
    write_quarantine(settings, await validate_tasks(tasks, backend, CheckPlan(1), suite="starter"))
    fixed = good[0].model_copy(update={"id": "deliberately-weak"})  # its tests repaired
    write_quarantine(
        settings, await validate_tasks([fixed], backend, CheckPlan(1), suite="starter")
    )
    assert load_quarantine(settings, "starter") == {"deliberately-broken"}


@pytest.mark.asyncio
async def test_randomly_passing_task_is_flaky(backend: SandboxBackend) -> None:
    coin = TaskSpec(
        id="coin-flip",
        prompt="p",
        entry_point="f",
        canonical_solution="def f():\n    return 1\n",
        tests="import os\n\ndef check(candidate):\n    assert os.urandom(1)[0] % 2 == 0\n",
    )
    report = await validate_tasks([coin], backend, CheckPlan(24, 8), suite="coin")
    # P(24 fair coin flips all agree) = 2**-23: the verdict is flaky unless os.urandom is broken
    [check] = report.tasks
    assert {run.status for run in check.canonical} == {"passed", "failed"}
    assert check.verdict == "flaky" and report.quarantined == ["coin-flip"]


@pytest.mark.asyncio
async def test_platform_faults_are_retried_not_counted_against_the_task(
    backend: SandboxBackend,
) -> None:
    task = load_suite("starter")[0]
    platform = FlakyPlatform(backend, faults=2)
    report = await validate_tasks(
        [task], platform, CheckPlan(1, 1), suite="starter", backoff=FAST_RETRY
    )
    assert report.tasks[0].verdict == "clean" and report.infra_retries == 2


@pytest.mark.asyncio
async def test_persistent_platform_faults_are_infra_not_broken(backend: SandboxBackend) -> None:
    task = load_suite("starter")[0]
    platform = FlakyPlatform(backend, faults=10**6)
    report = await validate_tasks(
        [task], platform, CheckPlan(2), suite="starter", backoff=FAST_RETRY
    )
    assert report.ids("infra") == [task.id] and report.ids("broken") == []
    assert report.quarantined == [] and platform.calls == 3 * FAST_RETRY.offline_attempts
    assert "injected platform fault" in report.tasks[0].canonical[0].detail


def run_cli(settings: Settings, *argv: str) -> int:
    return run(list(argv), settings)


def test_cli_validate_and_ls(
    settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        run_cli(
            settings,
            "tasks",
            "validate",
            "starter",
            "--limit",
            "3",
            "--repeats",
            "1",
            "--backend",
            "local",
            "--json",
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert [t["verdict"] for t in report["tasks"]] == ["clean"] * 3
    assert load_quarantine(settings, "starter") == set()

    assert run_cli(settings, "tasks", "ls", "starter", "--split", "heldout", "--json") == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(listed) == 80 and {row["split"] for row in listed} == {"heldout"}
    assert run_cli(settings, "tasks", "ls", str(tmp_path / "absent.jsonl")) == 2


@pytest.mark.slow
def test_full_starter_suite_is_clean(settings: Settings) -> None:
    assert (
        run_cli(
            settings,
            "tasks",
            "validate",
            "starter",
            "--repeats",
            "2",
            "--concurrency",
            "8",
            "--backend",
            "local",
        )
        == 0
    )
    assert load_quarantine(settings, "starter") == set()


@pytest.mark.slow
def test_full_humaneval_is_clean_at_k5_c8(settings: Settings) -> None:
    assert (
        run_cli(
            settings,
            "tasks",
            "validate",
            "humaneval",
            "--repeats",
            "5",
            "--concurrency",
            "8",
            "--backend",
            "local",
        )
        == 0
    )
    document = json.loads((settings.home / "quarantine" / "humaneval.json").read_text())
    assert document["tasks"] == 164 and document["quarantined"] == [] and document["infra"] == []
