"""Bad input to `tempered eval`, `tasks validate` and `sandbox run` is one line on stderr, and
nothing runs or is written: no tasks waiting in Temporal for a policy version that was never
published, no quarantine list drawn from runs that could not pass. Real SeaweedFS, no mocks."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts.learner import PolicyManifest, PolicyVersion
from infra import keys
from infra.seaweed import pick_free_ports
from infra.settings import Settings, TemporalSettings
from infra.storage import ObjectStore
from infra.tasks import quarantine_path
from tests.fixtures.s3 import SeaweedServer
from workers.cli import run

Capture = pytest.CaptureFixture[str]


def one_line(capsys: Capture) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_eval_of_a_version_never_published_is_refused_before_any_task_starts(
    seaweed: SeaweedServer, store: ObjectStore, tmp_path: Path, capsys: Capture
) -> None:
    """The tasks waited for the version without a word (`policy_wait_s` each) and stayed in
    Temporal. Temporal here is a port nothing listens on: the refusal comes before it."""
    policy = PolicyVersion(run_id="r1", version=0, prefix=keys.policy_prefix("r1", 0), step=0)
    store.put_json(keys.policy_manifest_key("r1", 0), PolicyManifest(policy=policy, files={}))
    settings = Settings(
        home=tmp_path,
        s3=seaweed.settings.model_copy(update={"bucket": store.bucket}),
        temporal=TemporalSettings(address=f"127.0.0.1:{pick_free_ports()[0]}"),
    )
    argv = ["eval", "--run", "r1", "--suite", "starter", "--limit", "1", "--policy"]
    assert run([*argv, "3"], settings) == 1
    assert one_line(capsys) == (
        "tempered eval: run 'r1' has no policy version 3 (published: v0; "
        "`tempered runs show RUN` lists them)\n"
    )
    assert run([*argv[:2], "nope", *argv[3:], "0"], settings) == 1
    assert "run 'nope' has no policy version 0 (published: none;" in one_line(capsys)


@pytest.mark.parametrize(
    ("timeout", "message"),
    [("0", "greater than 0"), ("-1", "greater than 0"), ("1e9", "less than or equal to 3600")],
)
def test_tasks_validate_with_an_impossible_timeout_runs_and_quarantines_nothing(
    timeout: str, message: str, tmp_path: Path, capsys: Capture
) -> None:
    """`--timeout 0` timed every run out and wrote the suite into its quarantine list."""
    settings = Settings(home=tmp_path / "home")
    argv = ["tasks", "validate", "starter", "--limit", "2", "--repeats", "1", "--timeout"]
    assert run([*argv, timeout], settings) == 2
    assert f"SandboxLimits: timeout_s: Input should be {message}" in one_line(capsys)
    assert not quarantine_path(settings, "starter").exists()


def test_sandbox_run_limits_out_of_bounds_are_one_line(tmp_path: Path, capsys: Capture) -> None:
    program = tmp_path / "program.py"
    program.write_text("print(1)\n")
    argv = ["sandbox", "run", str(program), "--timeout", "-1", "--memory-mb", "0"]
    assert run(argv, Settings(home=tmp_path / "home")) == 1
    assert one_line(capsys) == (
        "tempered sandbox: SandboxLimits: timeout_s: Input should be greater than 0; "
        "memory_mb: Input should be greater than or equal to 16\n"
    )
