"""`tempered eval --run RUN --policy V` with a V that is a number but no version (negative, a
fraction) is refused as a version, not taken for a model name. No server is asked: the
refusal comes before the store is read (an S3 nothing listens at)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.cli_settings import cli_settings, nowhere, nowhere_endpoint
from workers.cli import run


@pytest.mark.parametrize("policy", ["-1", "1.5", "-0.5", "2e3", "+3", ".5", "3."])
def test_a_policy_version_that_is_no_whole_number_is_refused_as_a_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str
) -> None:
    """It said "--policy -1 is a model (a preset, a directory or an s3:// prefix) ... leave
    --run out"."""
    settings = cli_settings(tmp_path / "home", endpoint=nowhere_endpoint(), temporal=nowhere())
    argv = ["eval", "--run", "r1", "--suite", "starter", "--limit", "1", f"--policy={policy}"]
    assert run(argv, settings) == 2
    err = capsys.readouterr().err
    assert err == f"tempered eval: --policy VERSION: a whole number, 0 or more, not {policy!r}\n"


def test_a_model_name_with_run_is_still_refused_as_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = cli_settings(tmp_path / "home", endpoint=nowhere_endpoint(), temporal=nowhere())
    argv = ["eval", "--run", "r1", "--suite", "starter", "--policy", "smollm2"]
    assert run(argv, settings) == 2
    assert "--policy smollm2 is a model" in capsys.readouterr().err
