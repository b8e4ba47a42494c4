"""`tempered train --dry-run` prints the plan and starts nothing, as bad options do; `tempered
--help` stays light; `--attach` takes no run option (a 0 included), starts no worker before the
run is found, and reports the run's own wall time (`test_train_attach.py`: a run that ended)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from contracts.names import Queue
from contracts.run import TrainingRunInput, TrainingRunResult
from infra.presets import preset_names
from infra.settings import Settings
from infra.tasks import load_suite, quarantine_path
from workers.cli import run
from workers.training import FoundRun


def test_dry_run_prints_the_plan_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(home=tmp_path / "home")
    argv = [
        "train",
        "--preset",
        "tiny",
        "--steps",
        "5",
        "--seed",
        "7",
        "--run-id",
        "dry",
        "--dry-run",
    ]
    assert run(argv, settings) == 0
    plan = json.loads(capsys.readouterr().out)
    run_input = TrainingRunInput.model_validate(plan["input"])
    assert (run_input.run_id, run_input.steps, run_input.seed) == ("dry", 5, 7)
    assert run_input.base_model == "tiny"
    assert plan["workflow"] == {
        "type": "TrainingRunWorkflow",
        "id": "train-dry",
        "task_queue": "agent-tasks",
        "namespace": "default",
    }
    assert plan["workers"] == [q.value for q in Queue]
    assert plan["stack"]["temporal"] == settings.temporal.address
    assert not settings.home.exists()  # no pidfile, no log, no report: nothing started

    assert run([*argv, "--no-workers"], settings) == 0
    assert json.loads(capsys.readouterr().out)["workers"] == []


@pytest.mark.parametrize("preset", preset_names())
def test_every_preset_plans_a_run_on_a_suite_with_both_splits(
    preset: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(home=tmp_path / "home")
    assert run(["train", "--preset", preset, "--dry-run"], settings) == 0
    run_input = TrainingRunInput.model_validate(json.loads(capsys.readouterr().out)["input"])
    assert load_suite(run_input.suite, split="train") and load_suite(
        run_input.suite, split="heldout"
    )


def test_a_bad_preset_is_one_line_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(home=tmp_path / "home")
    assert run(["train", "--preset", "nope", "--dry-run"], settings) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("tempered train: unknown preset 'nope' (known: ")
    assert len(captured.err.splitlines()) == 1 and not settings.home.exists()
    assert run(["train", "--preset", "tiny", "--steps", "0"], settings) == 2
    error = capsys.readouterr().err
    # the flag is at fault, not the preset (it said "preset tiny: steps: …")
    assert error == "tempered train: --steps 0: steps: Input should be greater than or equal to 1\n"
    assert not settings.home.exists()
    # an evaluation's form: `tempered runs rm exp` would delete this run as exp's evaluation
    assert run(["train", "--preset", "tiny", "--run-id", "exp-eval-v2-retry"], settings) == 2
    error = capsys.readouterr().err
    assert "has the form of an evaluation's run id" in error and len(error.splitlines()) == 1
    assert not settings.home.exists()


def test_help_parses_without_importing_torch() -> None:
    probe = (
        "import sys, contextlib, io\n"
        "from workers.cli import run\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    run(['--help'])\n"
        "heavy = {'torch', 'transformers', 'deepspeed', 'matplotlib'} & set(sys.modules)\n"
        "print(sorted(heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stderr


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--steps", "3", "--preset", "tiny"], "--steps, --preset"),
        # zeros were taken for options not given (tested by truth), and silently ignored
        (["--seed", "0"], "--seed"),
        (["--keep-versions", "0"], "--keep-versions"),
        (["--time-budget", "0"], "--time-budget"),
        (["--steps", "0", "--dry-run"], "--steps, --dry-run"),
    ],
)
def test_attach_takes_no_run_options_and_starts_nothing(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    options: list[str],
    named: str,
) -> None:
    from workers.cli import train

    started: list[str] = []  # a stack brought up here would outlive the test
    monkeypatch.setattr(
        train.stack, "up", lambda _settings, say=None: started.append("stack") or []
    )
    monkeypatch.setattr(train, "ensure_workers", lambda _settings: started.append("workers") or [])
    settings = Settings(home=tmp_path / "home")
    assert run(["train", "--attach", "r1", *options], settings) == 2
    error = capsys.readouterr().err
    assert error == f"tempered train: --attach takes no run options (got {named})\n"
    assert not settings.home.exists() and started == []


def test_attach_to_no_run_starts_no_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stack and all five workers were brought up (workers running with other settings
    restarted) before the run was looked up: `--attach typo` exited 2 having started them."""
    from workers.cli import train

    done: list[str] = []

    async def connect(_settings: Settings, **_: object) -> object:
        done.append("connect")
        return object()

    async def attach(_client: object, run: str) -> None:
        raise ValueError(f"no training run {run!r} (workflow train-{run})")

    monkeypatch.setattr(train.stack, "up", lambda _settings, say=None: done.append("stack") or [])
    monkeypatch.setattr(train, "ensure_workers", lambda _settings: done.append("workers") or [])
    monkeypatch.setattr(train, "connect", connect)
    monkeypatch.setattr(train, "attach", attach)
    assert run(["train", "--attach", "typo"], Settings(home=tmp_path)) == 2
    assert (
        capsys.readouterr().err == "tempered train: no training run 'typo' (workflow train-typo)\n"
    )
    assert done == ["stack", "connect"]


def test_a_bad_suite_is_one_line_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A suite that cannot load, or leaves nothing to train on, passed `--dry-run`; a real run
    started the stack, five workers and its workflow, and failed in its first activity."""
    settings = Settings(home=tmp_path / "home")
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "malformed.jsonl").write_text('{"id": "a"\n')
    task = load_suite("starter", split="heldout")[0]
    (tmp_path / "heldout.jsonl").write_text(task.model_dump_json() + "\n")
    problems = {
        "nosuch": "unknown suite 'nosuch'",
        "harbor:/nonexistent": "/nonexistent: no such directory of Harbor tasks",
        str(tmp_path / "empty.jsonl"): "empty.jsonl: no tasks in file",
        str(tmp_path / "malformed.jsonl"): "malformed.jsonl:1: invalid JSON",
        str(tmp_path / "heldout.jsonl"): "heldout.jsonl' has no training tasks",
    }
    for suite, problem in problems.items():  # checked before the plan as before a real run
        assert run(["train", "--preset", "tiny", "--suite", suite, "--dry-run"], settings) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and problem in captured.err, suite
        assert len(captured.err.splitlines()) == 1 and not settings.home.exists()


def test_paths_only_remote_workers_can_see_are_theirs_to_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With `--no-workers` the run's workers may run elsewhere and read paths this machine does
    not have (a shared volume): those pass; what is here, and built-in names, are checked."""
    settings = Settings(home=tmp_path / "home")
    remote = ["--suite", "/shared/tasks.jsonl", "--base-model", "/models/mine", "--no-workers"]
    assert run(["train", "--preset", "tiny", *remote, "--dry-run"], settings) == 0
    planned = json.loads(capsys.readouterr().out)
    assert "/shared/tasks.jsonl" in json.dumps(planned) and "/models/mine" in json.dumps(planned)
    harbor = ["--suite", "harbor:/shared/harbor", "--no-workers", "--dry-run"]
    assert run(["train", "--preset", "tiny", *harbor], settings) == 0
    capsys.readouterr()
    (tmp_path / "malformed.jsonl").write_text('{"id": "a"\n')
    for suite in ("nosuch", str(tmp_path / "malformed.jsonl")):
        argv = ["train", "--preset", "tiny", "--suite", suite, "--no-workers", "--dry-run"]
        assert run(argv, settings) == 2, suite
    assert "invalid JSON" in capsys.readouterr().err


def test_a_suite_whose_training_tasks_are_all_quarantined_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings(home=tmp_path / "home")
    train = [task.model_dump_json() for task in load_suite("starter", split="train")[:2]]
    suite = tmp_path / "two.jsonl"
    suite.write_text("\n".join(train) + "\n")
    quarantine = quarantine_path(settings, str(suite))
    quarantine.parent.mkdir(parents=True)
    quarantine.write_text(json.dumps({"quarantined": [load_suite(str(suite))[0].id]}))
    assert run(["train", "--preset", "tiny", "--suite", str(suite), "--dry-run"], settings) == 0
    capsys.readouterr()
    quarantine.write_text(json.dumps({"quarantined": [t.id for t in load_suite(str(suite))]}))
    assert run(["train", "--preset", "tiny", "--suite", str(suite), "--dry-run"], settings) == 2
    assert capsys.readouterr().err == (
        f"tempered train: suite '{suite}' has no training tasks left (2 quarantined by "
        "`tempered tasks validate`)\n"
    )


def test_a_base_model_that_is_not_one_is_refused_by_the_dry_run(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--base-model /nonexistent` passed `--dry-run`; a real run started the stack and five
    workers and failed in its first learner activity. Presets, model directories and s3://
    prefixes pass as before (what `infra.base_models.materialize_base_model` takes)."""
    settings = Settings(home=tmp_path / "home")
    (tmp_path / "empty").mkdir()
    (tmp_path / "file").write_text("x")
    problems = {
        "/nonexistent": "no such directory",
        "HuggingFaceTB/SmolLM2-135M-Instruct": "no such directory",  # hub ids are not fetched
        str(tmp_path / "empty"): "a directory without config.json",
        str(tmp_path / "file"): "not a directory",
    }
    argv = ["train", "--preset", "tiny", "--dry-run", "--base-model"]
    for model, problem in problems.items():
        assert run([*argv, model], settings) == 2, model
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err == (
            f"tempered train: base_model {model!r}: {problem}; use a preset (tiny, smollm2), "
            "an s3:// prefix, or a directory holding config.json\n"
        )
    for model in ("tiny", "smollm2", str(tiny_dir), "s3://bucket/models/m"):
        assert run([*argv, model], settings) == 0, model
        assert json.loads(capsys.readouterr().out)["input"]["base_model"] == model
    assert not settings.home.exists()


def test_a_time_budget_that_is_not_a_number_is_refused_in_a_preset_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TOML spells nan and inf too: `time_budget_s = nan` read as "should be >= 0"."""
    settings = Settings(home=tmp_path / "home")
    for value in ("nan", "inf"):
        preset = tmp_path / f"{value}.toml"
        preset.write_text(f"time_budget_s = {value}\n")
        assert run(["train", "--preset", str(preset), "--dry-run"], settings) == 2
        assert capsys.readouterr().err == (
            f"tempered train: {preset}: time_budget_s: Input should be a finite number\n"
        )


def test_attach_prints_the_runs_own_wall_time_as_the_report_has_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Attached to a run that began 500 s ago and ends now: the summary said `finished in 0s`
    (since following began) while report.json and the profile said 500 s."""
    from workers.cli import progress, train

    run_input = TrainingRunInput(run_id="r1", steps=3)
    outcome = TrainingRunResult(
        run_id="r1", steps=3, tasks_started=6, tasks_done=6, history=[], evals=[]
    )

    class Handle:
        id = "train-r1"

        async def result(self) -> TrainingRunResult:
            return outcome

    done: list[str] = []

    async def attach(_client: object, _run: str) -> FoundRun:
        done.append("attach")
        started = datetime.now(UTC) - timedelta(seconds=500)
        handle: Any = Handle()  # what following uses of a RunHandle
        return FoundRun(handle, run_input, started, closed=None, state="running")

    async def connect(_settings: Settings, **_: object) -> object:
        return object()

    async def watch(_handle: Handle, done: asyncio.Future[object]) -> AsyncIterator[None]:
        await done  # the run ends at once: no progress to show
        return
        yield

    reported: list[float] = []

    def write_report(
        _s: Settings, _i: TrainingRunInput, _r: object, wall_s: float, ended: float | None
    ) -> Path:
        assert ended is None  # followed to its end: it ended now
        reported.append(wall_s)
        return tmp_path

    monkeypatch.setattr(train.stack, "up", lambda _settings, say=None: [])
    monkeypatch.setattr(train, "ensure_workers", lambda _settings: done.append("workers") or [])
    monkeypatch.setattr(train, "connect", connect)
    monkeypatch.setattr(train, "attach", attach)
    monkeypatch.setattr(train, "write_report", write_report)
    monkeypatch.setattr(progress, "watch", watch)
    assert run(["train", "--attach", "r1"], Settings(home=tmp_path)) == 0
    assert done == ["attach", "workers"]  # a running run is followed with its workers up
    [wall_s] = reported
    assert wall_s == pytest.approx(500, abs=5)
    out = capsys.readouterr().out
    assert f"run r1 finished in {wall_s:.0f}s: 3 steps" in out, out


def test_train_prints_what_up_started_before_a_later_start_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`tempered up` says each service's line as it comes; `train` printed the lines once all
    had started, so when the last start failed (the error names what it stopped), the lines of
    those that had started were never shown."""
    from infra.stack_services import StackError
    from workers.cli import train

    def up(_settings: Settings, say=lambda line: None) -> list[str]:
        say("temporal: started at 127.0.0.1:7233")
        raise StackError("seaweedfs did not start; stopped temporal (started by this `up`)")

    monkeypatch.setattr(train.stack, "up", up)
    assert run(["train", "--attach", "r1"], Settings(home=tmp_path)) == 1
    out, err = capsys.readouterr()
    assert out == "temporal: started at 127.0.0.1:7233\n"
    assert "seaweedfs did not start" in err
