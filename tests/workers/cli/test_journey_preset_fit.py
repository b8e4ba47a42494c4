"""`tempered train` refuses, before anything starts, a preset whose sampling does not fit the
suite's tasks, naming the preset that does: the default preset on `harbor:examples/harbor` or
`workspace` (a code-block stop, turns unguided: SmolLM2 made no valid tool call in 24, every group
flat, nothing learned) and `--preset agent` on code tasks (every turn forced to a tool call; a
code task has none). Both passed `--dry-run` silently. The real CLI's `--dry-run`; an S3 nothing
listens at (the run id is left unchecked), no server needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contracts.task import EnvName, SamplingParams
from infra.settings import Settings
from tests.workers.cli.train_dry_run import dry_run
from tests.workers.cli.train_dry_run import settings as settings  # a fixture

HARBOR = str(Path(__file__).resolve().parents[3] / "examples" / "harbor")
CODE_TASK = {
    "id": "add-0",
    "prompt": "Write add(a, b) returning a + b.",
    "entry_point": "add",
    "tests": "def check(candidate):\n    assert candidate(0, 3) == 3\n",
}


@pytest.fixture
def code_suite(tmp_path: Path) -> str:
    path = tmp_path / "some_code_tasks.jsonl"
    path.write_text(json.dumps(CODE_TASK) + "\n", encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("suite", [f"harbor:{HARBOR}", "workspace"])
def test_the_default_preset_on_a_workspace_suite_is_refused_naming_agent(
    suite: str, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err, out = dry_run(["--suite", suite], settings, capsys)
    assert code == 2 and not out, (code, err)
    assert err.count("tempered train:") == 1, err  # one line
    assert "has workspace tasks" in err and "for code tasks" in err, err
    assert "stop_after_code_block" in err and "use --preset agent" in err, err


def test_the_agent_preset_on_code_tasks_is_refused_naming_the_default(
    code_suite: str, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err, out = dry_run(["--preset", "agent", "--suite", code_suite], settings, capsys)
    assert code == 2 and not out, (code, err)
    assert "has code tasks" in err and "for workspace tasks" in err, err
    assert "tool_choice = 'required'" in err and "use --preset smollm2" in err, err


@pytest.mark.parametrize(
    "argv",
    [
        [],  # the default preset on its starter suite
        ["--suite", "code_suite"],
        ["--preset", "agent", "--suite", "workspace"],
        ["--preset", "agent", "--suite", f"harbor:{HARBOR}"],
        ["--preset", "tiny", "--suite", "basics"],  # sampling that fits both envs
        ["--preset", "tiny", "--suite", "code_suite"],
    ],
)
def test_a_preset_that_fits_its_suite_plans_its_run(
    argv: list[str], code_suite: str, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [code_suite if arg == "code_suite" else arg for arg in argv]
    code, err, out = dry_run(argv, settings, capsys)
    assert code == 0, err
    assert json.loads(out)["input"]["suite"], out


def test_sampling_env_is_the_env_a_turn_fits() -> None:
    from workers.cli.train_inputs import sampling_env  # here: the CLI tests run without it

    assert sampling_env(SamplingParams(stop_after_code_block=True)) is EnvName.CODE
    assert sampling_env(SamplingParams(tool_choice="required")) is EnvName.WORKSPACE
    assert sampling_env(SamplingParams(stop_after_tool_call=True)) is EnvName.WORKSPACE
    assert sampling_env(SamplingParams()) is None
