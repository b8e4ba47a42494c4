"""The CLI refuses counts that cannot work at parse time, with one line naming the argument:
`tempered eval --concurrency 0` once waited for good (a semaphore of 0), `--limit 0` evaluated
the whole suite and `--limit -2` all but its last two tasks; and makes the paths a run's
workers read absolute."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra import keys
from infra.policy_cache import forget_run
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


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--attach", ""],
        ["train", "--attach", "a/b"],
        ["stop", ""],
        ["stop", "../x"],
        ["eval", "--policy", "3", "--run", ""],
        ["eval", "--policy", "3", "--run", "run 1"],
        ["runs", "rm", "r1", ""],
        ["runs", "prune", ""],
        ["runs", "show", "bad/../id"],
        ["regrade", ""],
    ],
)
def test_a_run_id_that_cannot_be_one_is_refused_at_parse_time(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`train --attach ""` started a new run of the default preset (an empty id was read as no
    `--attach`); an empty id is also the prefix of every run: `runs rm ""` deleted them all."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"{argv[-1]!r} is not a run id (letters, digits, '_', '.', '-'; at most 128)" in err


def test_up_help_names_the_settings_that_choose_its_ports(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up", "--help"])
    out = capsys.readouterr().out
    for assigned in (
        "TEMPERED_TEMPORAL__ADDRESS=127.0.0.1:7233",
        "TEMPERED_TEMPORAL__UI_PORT=8233",
        "TEMPERED_S3__ENDPOINT=http://127.0.0.1:8333",
        "TEMPERED_S3__EMBEDDED_BASE_PORT=9333",
    ):
        assert assigned in out


def test_an_id_that_is_not_one_names_no_prefix_and_no_cache(tmp_path: Path) -> None:
    """The store's and the cache's guard behind the CLI's: `runs/` + "" + `/` is every run."""
    (tmp_path / "run-a").mkdir()
    for bad in ("", "a/b", "..", "."):
        with pytest.raises(ValueError, match="is not a run id"):
            keys.run_prefix(bad)
        with pytest.raises(ValueError, match="is not a run id"):
            forget_run(tmp_path, bad)
    assert (tmp_path / "run-a").is_dir()


@pytest.mark.parametrize("argv", [["runs", "show", "r1", "--task", "t", "--sample", "-1"],
                                  ["runs", "prune", "r1", "--keep", "-1"]])  # fmt: skip
def test_a_negative_index_or_count_is_refused_at_parse_time(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert "-1 is not 0 or more" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "infinity", "1e999"])
@pytest.mark.parametrize(
    "argv",
    [["train", "--time-budget"], ["tasks", "validate", "starter", "--timeout"],
     ["sandbox", "run", "p.py", "--timeout"]],
)  # fmt: skip
def test_seconds_that_are_not_a_number_are_refused_at_parse_time(
    argv: list[str], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--time-budget nan` was reported as "should be greater than or equal to 0", and `inf`
    passed as no budget at all."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*argv, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"{value!r} is not a number (a finite one, e.g. 30)" in err and "Traceback" not in err
    assert build_parser().parse_args([*argv, "2.5"]).__dict__[argv[-1][2:].replace("-", "_")] == 2.5
