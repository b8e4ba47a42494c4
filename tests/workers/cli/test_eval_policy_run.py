"""`tempered eval --policy PRESET|DIR --run RUN` is refused (exit 2, one line, nothing run): the
run was ignored, its settings and held-out set too, even a run that does not exist, and
`--current-tasks` then passed its check for nothing. A run's version is `--run RUN --policy N`
(its base model: `--policy 0`). Temporal and S3 are ports nothing listens on: the refusal comes
before either is asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.cli_settings import cli_settings, nowhere, nowhere_endpoint
from workers.cli import run


@pytest.mark.parametrize("policy", ["tiny", "/nonexistent/model"], ids=["a-preset", "a-directory"])
@pytest.mark.parametrize("extra", [[], ["--current-tasks"]], ids=["plain", "current-tasks"])
def test_eval_of_a_preset_or_directory_with_a_run_is_refused(
    policy: str, extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = cli_settings(tmp_path / "home", temporal=nowhere(), endpoint=nowhere_endpoint())
    argv = ["eval", "--policy", policy, "--run", "nosuchrun", "--suite", "starter", *extra]
    assert run(argv, settings) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("tempered eval: --run names a run whose version to evaluate"), err
    assert f"--policy {policy} is a model (a preset, a directory" in err, err
    assert "--policy 0" in err, err
    assert not settings.home.exists()  # no model built
