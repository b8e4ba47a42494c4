"""`tempered train` on a suite of code and workspace tasks in one JSONL: the refusal named a
preset for the other env (smollm2 said "use --preset agent", agent said "use --preset
smollm2": a ping-pong), never `tiny`, whose sampling fits both. It now says the suite has
several envs and names the presets whose sampling fits every env present, and the setting to
drop otherwise. The real CLI's `--dry-run`; an S3 nothing listens at, no server needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.seaweed import pick_free_ports
from infra.settings import S3Settings, Settings
from infra.tasks import load_suite
from workers.cli import run


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    endpoint = f"http://127.0.0.1:{pick_free_ports()[0]}"  # no store: the dry run says so
    return Settings(home=tmp_path / "home", s3=S3Settings(endpoint=endpoint))


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
    code = run(["train", "--preset", preset, "--suite", mixed_suite, "--dry-run"], settings)
    captured = capsys.readouterr()
    err = " ".join(captured.err.split())
    assert code == 2 and not captured.out, (code, err)
    assert err.count("tempered train:") == 1, err
    assert "has code and workspace tasks" in err, err
    assert setting in err and "--preset tiny" in err, err
    assert "--preset agent" not in err and "--preset smollm2" not in err, err  # no ping-pong


def test_tiny_plans_its_run_on_the_mixed_suite(
    mixed_suite: str, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run(["train", "--preset", "tiny", "--suite", mixed_suite, "--dry-run"], settings)
    assert code == 0, capsys.readouterr().err
