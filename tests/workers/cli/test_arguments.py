"""The CLI refuses counts that cannot work at parse time, with one line naming the argument:
`tempered eval --concurrency 0` once waited for good (a semaphore of 0), `--limit 0` evaluated
the whole suite and `--limit -2` all but its last two tasks; and makes the paths a run's
workers read absolute."""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.cli import build_parser
from workers.cli.train import absolute


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["eval", "--policy", "3", "--run", "r", "--concurrency", "0"], "0 is not a positive"),
        (["eval", "--policy", "3", "--run", "r", "--limit", "-2"], "-2 is not a positive"),
        (["eval", "--policy", "3", "--limit", "two"], "'two' is not a whole number"),
        (["eval", "--policy", "3", "--max-new-tokens", "0"], "0 is not a positive"),
        (["tasks", "validate", "starter", "--limit", "0"], "0 is not a positive"),
        (["tasks", "validate", "starter", "--repeats", "0"], "0 is not a positive"),
        (["tasks", "validate", "starter", "--concurrency", "-1"], "-1 is not a positive"),
    ],
)
def test_counts_below_one_are_refused_naming_the_argument(
    argv: list[str], error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert f"argument --{argv[-2].lstrip('-')}: {error}" in capsys.readouterr().err


def test_positive_counts_parse() -> None:
    args = build_parser().parse_args(["eval", "--policy", "3", "--limit", "5"])
    assert (args.limit, args.concurrency) == (5, 64)


def test_paths_the_workers_read_are_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers run in the stack's home: `--base-model ./model` failed there (its dry run
    passed). Names that are not paths here stay as they are, also where a path shares one."""
    for name in ("model", "starter", "smollm2"):
        (tmp_path / name).mkdir()
    (tmp_path / "tasks.jsonl").write_text("")
    monkeypatch.chdir(tmp_path)
    assert absolute("model") == absolute("./model") == str(tmp_path / "model")
    assert absolute("harbor:model") == f"harbor:{tmp_path / 'model'}"
    assert absolute("tasks.jsonl") == str(tmp_path / "tasks.jsonl")
    kept = ["starter", "smollm2", "s3://bucket/prefix", "missing", None]
    assert [absolute(spec) for spec in kept] == kept
