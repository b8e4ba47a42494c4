"""`tempered train` on a suite of code and workspace tasks in one JSONL: the refusal named a
preset for the other env (smollm2 said "use --preset agent", agent said "use --preset
smollm2": a ping-pong), never `tiny`, whose sampling fits both. It now says the suite has
several envs and names the presets whose sampling fits every env present, and the setting to
drop otherwise. The real CLI's `--dry-run`; an S3 nothing listens at, no server needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.settings import Settings
from infra.tasks import load_suite
from tests.workers.cli.train_dry_run import dry_run
from tests.workers.cli.train_dry_run import settings as settings  # a fixture


@pytest.fixture
def mixed_suite(tmp_path: Path) -> str:
    """Three train and two held-out tasks each of `starter` (code) and `basics` (workspace)."""
    lines = []
    for name in ("starter", "basics"):
        tasks = load_suite(name)
        for split in ("train", "heldout"):
            chosen = [task for task in tasks if task.split == split][: 3 if split == "train" else 2]
            lines += [task.model_dump_json() for task in chosen]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert {json.loads(line)["env"] for line in lines} == {"code", "workspace"}
    return str(path)


@pytest.mark.parametrize(
    ("preset", "setting"),
    [("smollm2", "stop_after_code_block"), ("agent", "tool_choice = 'required'")],
)
def test_a_mixed_suite_names_the_preset_that_fits_both_envs(
    preset: str,
    setting: str,
    mixed_suite: str,
    settings: Settings,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, err, out = dry_run(["--preset", preset, "--suite", mixed_suite], settings, capsys)
    assert code == 2 and not out, (code, err)
    assert err.count("tempered train:") == 1, err
    assert "has code and workspace tasks" in err, err
    assert setting in err and "--preset tiny" in err, err
    assert "--preset agent" not in err and "--preset smollm2" not in err, err  # no ping-pong


def test_tiny_plans_its_run_on_the_mixed_suite(
    mixed_suite: str, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err, _ = dry_run(["--preset", "tiny", "--suite", mixed_suite], settings, capsys)
    assert code == 0, err
