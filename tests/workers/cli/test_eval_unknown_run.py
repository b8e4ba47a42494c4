"""`tempered eval --run nosuch --policy 1` names the run unknown, as `runs show` and `regrade`
do (`require_run`); it said "run 'nosuch' has no policy version 1 (published: none…)", as of a
run that exists. A run that exists but lacks the version is still told which it has. Real
SeaweedFS; Temporal is a port nothing listens on (the refusal comes before it is asked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra import keys
from infra.storage import ObjectStore
from tests.fixtures.cli_settings import cli_settings, nowhere
from workers.cli import run


def test_eval_of_a_run_that_does_not_exist_says_it_is_unknown(
    store: ObjectStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = cli_settings(tmp_path / "home", store, temporal=nowhere())
    assert run(["eval", "--run", "nosuch", "--policy", "1"], settings) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err == (
        f"tempered eval: unknown run 'nosuch': nothing stored under s3://{store.bucket}/runs/nosuch/"
    ), err

    store.put_json(keys.run_record_key("exists"), {"run_id": "exists"})  # a run, no versions
    assert run(["eval", "--run", "exists", "--policy", "1"], settings) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "run 'exists' has no policy version 1 (published: none;" in err, err
