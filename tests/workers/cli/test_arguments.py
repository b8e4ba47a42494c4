"""The CLI refuses counts that cannot work at parse time, with one line naming the argument:
`tempered eval --concurrency 0` once waited for good (a semaphore of 0), `--limit 0` evaluated
the whole suite and `--limit -2` all but its last two tasks; makes the paths a run's workers
read absolute; and refuses settings it cannot read or that name nothing, and a run whose
groups cannot train, before any command runs (exit 2, one line)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from contracts.run import TrainingRunInput
from infra import keys
from infra.policy_cache import forget_run
from infra.settings import Settings
from workers.cli import build_parser, run
from workers.cli.train_inputs import absolute


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


@pytest.fixture
def no_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory and no TEMPERED_ variables (the developer's never leak in)."""
    for name in [n for n in os.environ if n.upper().startswith("TEMPERED_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TEMPERED_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


LISTING = ["tasks", "ls", "starter"]
"""A command that runs with default settings and needs no server."""


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line `tempered ARGV` exits 2 with, before the command runs."""
    assert run(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert "Traceback" not in captured.err
    return captured.err.strip()


def test_a_settings_file_that_cannot_be_read_exits_2_naming_it(
    no_settings: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A PermissionError traceback for every command; a directory was "does not exist"."""
    config = no_settings / "my.toml"
    config.mkdir()
    err = refused(["--config", str(config), *LISTING], capsys)
    assert err == f"tempered: bad configuration: {config}: cannot read settings file (a directory)"
    config.rmdir()
    config.write_text("")
    real_open = Path.open

    def denied(self: Path, *args: object, **kwargs: object) -> object:
        if self.absolute() == config:  # as mode 000 does (the tests may run as root)
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(Path, "open", denied)
    monkeypatch.setenv("TEMPERED_CONFIG", str(config))
    err = refused(LISTING, capsys)
    assert (
        err
        == f"tempered: bad configuration: {config}: cannot read settings file (Permission denied)"
    )


def test_a_variable_that_names_no_setting_exits_2_naming_it(
    no_settings: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """TEMPERED_TEMPORAL_ADDRESS (one `_` where the nesting takes `__`) ran the command on the
    default address without a word."""
    monkeypatch.setenv("TEMPERED_TEMPORAL_ADDRESS", "foo:1")
    err = refused(LISTING, capsys)
    assert err.startswith("tempered: bad configuration: environment variable ")
    assert "TEMPERED_TEMPORAL_ADDRESS names no setting (did you mean TEMPERED_TEMPORAL__AD" in err
    monkeypatch.delenv("TEMPERED_TEMPORAL_ADDRESS")
    monkeypatch.setenv("TEMPERED_HOME", "")
    assert "environment variable TEMPERED_HOME is empty" in refused(LISTING, capsys)


def test_groups_of_one_are_a_new_runs_problem() -> None:
    def problem(group_size: int) -> str | None:
        return TrainingRunInput(run_id="r", group_size=group_size).new_run_problem()

    assert (problem(1) or "").startswith("group_size = 1: ")
    assert problem(2) is None


def test_a_run_of_groups_of_one_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A group of one episode is always flat (its advantage is 0): such a run trained nothing,
    and spent its redraw budget replacing groups no draw could fix."""
    preset = tmp_path / "g1.toml"
    preset.write_text("group_size = 1\n")
    argv = ["train", "--preset", str(preset), "--dry-run"]
    assert run(argv, Settings(home=tmp_path / "home")) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"tempered train: {preset}: group_size = 1: ") and "2 or more" in err


def test_a_negative_seed_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--seed -1` was accepted and drew the tasks in the order of `--seed 1` (random.Random
    seeds with the absolute value): two runs said to differ trained alike."""
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["train", "--seed", "-1"])
    assert exited.value.code == 2
    assert "argument --seed: -1 is not 0 or more" in capsys.readouterr().err
    assert build_parser().parse_args(["train", "--seed", "0"]).seed == 0
    recorded = TrainingRunInput(run_id="r", seed=-1)  # a run recorded before still decodes
    assert "a seed is 0 or more" in (recorded.new_run_problem() or "")  # a new one may not start
    preset = tmp_path / "s.toml"
    preset.write_text("seed = -1\n")
    assert run(["train", "--preset", str(preset), "--dry-run"], Settings(home=tmp_path)) == 2
    assert "seed" in capsys.readouterr().err
