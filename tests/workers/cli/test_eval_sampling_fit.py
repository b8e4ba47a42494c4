"""`tempered eval` refuses, as `train` does (`sampling_misfit`), evaluation sampling that does not
fit the suite's tasks: `--run <agent-preset run> --suite starter` sent `tool_choice =
"required"` to code tasks (inference rejected every one at its first generate, and the other
started tasks were left running in Temporal), and `--policy smollm2 --suite basics` (its own
settings stop at a code block) quietly reported pass@1 of about 0 on workspace tasks. Exit 2,
one line, before any model is published or a task started. Real SeaweedFS; Temporal is a port
nothing listens on (the refusal comes before it is asked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra import keys
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.fixtures.cli_settings import cli_settings, nowhere
from tests.workers.cli.eval_setup import agent_run
from workers.cli import run

RUN = "agentrun"


@pytest.fixture
def settings(store: ObjectStore, tmp_path: Path) -> Settings:
    return cli_settings(tmp_path / "home", store, temporal=nowhere())


def refusal(argv: list[str], settings: Settings, capsys: pytest.CaptureFixture[str]) -> str:
    """`tempered eval ARGV`'s one line, asserting it exits 2 and prints nothing on stdout."""
    code = run(["eval", *argv], settings)
    captured = capsys.readouterr()
    assert code == 2 and not captured.out, (code, captured.err)
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err, captured.err
    return " ".join(captured.err.split())


def test_an_agent_runs_version_on_code_tasks_is_refused(
    store: ObjectStore, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    agent_run(store, RUN)

    err = refusal(["--run", RUN, "--policy", "0", "--suite", "starter"], settings, capsys)
    assert err.startswith("tempered eval: suite 'starter' has code tasks"), err
    assert "eval_sampling is for workspace tasks only" in err, err
    assert "tool_choice = 'required'" in err, err
    assert not list(store.list_keys(keys.policy_readers_prefix(RUN)))  # no reader marked


def test_a_preset_on_a_workspace_suite_is_refused_before_it_is_published(
    store: ObjectStore, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refusal(["--policy", "tiny", "--suite", "basics"], settings, capsys)
    assert err.startswith("tempered eval: suite 'basics' has workspace tasks"), err
    assert "eval_sampling is for code tasks only (stop_after_code_block" in err, err
    assert "--run RUN --policy 0" in err, err  # the way to a run's settings
    assert not [key for key in store.list_keys("runs/") if "eval-base-" in key]
    assert not settings.home.exists()  # no model built
