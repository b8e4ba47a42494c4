"""`tempered eval` of a workspace suite refuses bad input before it writes anything: the suite's
trees went into the store (`workspace_specs`) before the sampling, the run id and the rest were
checked, so a refused eval left a suite's trees behind. Real SeaweedFS; Temporal is a port
nothing listens on (the refusal comes before it is asked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.run import TrainingRunInput
from contracts.task import SamplingParams
from infra import keys
from infra.settings import Settings
from infra.storage import ObjectStore
from tests.fixtures.cli_settings import cli_settings, nowhere
from tests.workers.cli.eval_setup import agent_run, publish_v0
from workers.cli import run

CODE_RUN = "coderun"
"""A run whose eval sampling stops at a code block: for code tasks only."""
LONG = "a" * 100
"""An agent run whose evaluation's run id (`<run>-eval-v0--basics-<tag>`) passes 128 characters."""


@pytest.fixture
def settings(store: ObjectStore, tmp_path: Path) -> Settings:
    return cli_settings(tmp_path / "home", store, temporal=nowhere())


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (  # its own settings stop at a code block: not for workspace tasks
            ["--policy", "tiny", "--suite", "basics"],
            "suite 'basics' has workspace tasks",
        ),
        (  # a run whose eval sampling is for code tasks
            ["--run", CODE_RUN, "--policy", "0", "--suite", "basics", "--limit", "3"],
            "suite 'basics' has workspace tasks",
        ),
        (  # sampling that fits; an evaluation run id too long
            ["--run", LONG, "--policy", "0", "--suite", "basics", "--split", "all"],
            "is not one (at most 128 characters)",
        ),
    ],
)
def test_a_refused_eval_of_a_workspace_suite_stores_nothing(
    argv: list[str],
    problem: str,
    store: ObjectStore,
    settings: Settings,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sampling = SamplingParams(temperature=0.0, max_new_tokens=64, stop_after_code_block=True)
    store.put_json(
        keys.run_record_key(CODE_RUN), TrainingRunInput(run_id=CODE_RUN, eval_sampling=sampling)
    )
    publish_v0(store, CODE_RUN)
    agent_run(store, LONG)
    before = set(store.list_keys(""))

    code = run(["eval", *argv, "--wait-for-workers"], settings)
    captured = capsys.readouterr()
    assert code == 2 and not captured.out, (code, captured.err)
    assert captured.err.count("\n") == 1 and problem in captured.err, captured.err
    assert set(store.list_keys("")) == before  # no tree, no marker, no model
    assert not settings.home.exists()
