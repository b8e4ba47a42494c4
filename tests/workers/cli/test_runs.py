"""`tempered runs ls/show` and `tempered regrade` on a small fabricated run in a real SeaweedFS."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from contracts.learner import PolicyManifest, PolicyVersion, TrainingRunInput
from contracts.sandbox import ExecStatus
from contracts.trajectory import RewardRecord, Trajectory, TrajectoryTurn, trajectory_id
from infra import keys
from infra.seaweed import pick_free_ports
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import load_suite
from tests.fixtures.s3 import SeaweedServer
from workers.cli import run

RUN = "demo"
Capture = pytest.CaptureFixture[str]


def cli(argv: list[str], settings: Settings) -> int:
    return run(argv, settings)


def settings_for(
    server: SeaweedServer, store: ObjectStore, tmp_path: Path, **s3: object
) -> Settings:
    return Settings(
        home=tmp_path, s3=server.settings.model_copy(update={"bucket": store.bucket, **s3})
    )


def trajectory(task_id: str, sample: int, code: str, solved: bool) -> Trajectory:
    turn = TrajectoryTurn(
        turn=0,
        policy_version=sample,
        prompt_token_ids=[1],
        completion_token_ids=[2],
        completion_logprobs=[-0.1],
        completion_text=code,
        code=code,
        status=ExecStatus.PASSED if solved else ExecStatus.FAILED,
        reward=1.0 if solved else -0.1,
    )
    return Trajectory(
        id=trajectory_id(RUN, task_id, sample),
        run_id=RUN,
        task_id=task_id,
        sample=sample,
        group_size=2,
        prompt="p",
        turns=[turn],
        reward=turn.reward,
        solved=solved,
        policy_version=sample,
        created_at="2025-01-01T00:00:00Z",
    )


@pytest.fixture
def demo_run(store: ObjectStore) -> list[Trajectory]:
    """Two starter tasks × G=2. Recorded verdicts: sample 0 of the first task is recorded as
    failed although its final code is the canonical solution; sample 1 of the second task is
    recorded as solved although its code is the wrong solution. The other two are right."""
    first, second = load_suite("starter", split="train")[:2]
    assert first.canonical_solution and second.canonical_solution and second.wrong_solution
    stored = [
        trajectory(first.id, 0, first.canonical_solution, solved=False),
        trajectory(first.id, 1, first.canonical_solution, solved=True),
        trajectory(second.id, 0, second.canonical_solution, solved=True),
        trajectory(second.id, 1, second.wrong_solution, solved=True),
    ]
    store.put_json(keys.run_record_key(RUN), TrainingRunInput(run_id=RUN, group_size=2))
    for t in stored:
        store.put_json(keys.trajectory_key(RUN, t.task_id, t.sample), t)
        store.put_text(keys.turn_key(RUN, t.task_id, t.sample, 0, "code.py"), t.turns[0].code)
    for version in (0, 1):
        policy = PolicyVersion(
            run_id=RUN, version=version, prefix=keys.policy_prefix(RUN, version), step=version
        )
        store.put_json(
            keys.policy_manifest_key(RUN, version), PolicyManifest(policy=policy, files={})
        )
    store.put_json(
        keys.latest_policy_key(RUN), PolicyVersion(run_id=RUN, version=1, prefix="x", step=1)
    )
    store.put_text("runs/other/run.json", "{}")
    return stored


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")


def test_runs_ls(
    seaweed: SeaweedServer,
    store: ObjectStore,
    demo_run: list[Trajectory],
    tmp_path: Path,
    capsys: Capture,
) -> None:
    assert cli(["runs", "ls"], settings_for(seaweed, store, tmp_path)) == 0
    out = capsys.readouterr().out
    assert re.search(r"demo\s*│\s*2\s*│\s*4\s*│\s*2\s*│\s*v1\s*│\s*-", out), out
    assert re.search(r"other\s*│\s*0\s*│\s*0\s*│\s*0\s*│\s*-", out), out


def test_runs_show(
    seaweed: SeaweedServer,
    store: ObjectStore,
    demo_run: list[Trajectory],
    tmp_path: Path,
    capsys: Capture,
) -> None:
    assert cli(["runs", "show", RUN], settings_for(seaweed, store, tmp_path)) == 0
    out = capsys.readouterr().out
    assert "suite starter, base tiny, G=2" in out
    assert "tasks 2  trajectories 4  mean reward +0.725  solved 3/4" in out
    first_task = demo_run[0].task_id
    assert re.search(
        rf"{re.escape(first_task)}\s*│\s*2\s*│\s*1/2\s*│\s*\+0\.450\s*│\s*1\s*│\s*0,1", out
    ), out
    assert re.search(r"v1\s*│\s*1\s*│\s*│\s*\*", out), out


@pytest.mark.parametrize(
    ("argv", "s3", "message"),
    [
        (
            ["runs", "show", "nope"],
            {},
            "tempered runs: unknown run 'nope': nothing stored under s3://",
        ),
        (
            ["runs", "ls"],
            {"access_key": "intruder"},
            "rejected the credentials for access key 'intruder'",
        ),
        (["regrade", "nope", "--grader", "bad/name"], {}, "--grader 'bad/name': use letters"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    seaweed: SeaweedServer,
    store: ObjectStore,
    demo_run: list[Trajectory],
    tmp_path: Path,
    capsys: Capture,
    argv: list[str],
    s3: dict[str, str],
    message: str,
) -> None:
    assert cli(argv, settings_for(seaweed, store, tmp_path, **s3)) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_s3_down_is_one_line_exit_2(
    seaweed: SeaweedServer, store: ObjectStore, tmp_path: Path, capsys: Capture
) -> None:
    endpoint = f"http://127.0.0.1:{pick_free_ports()[0]}"
    assert cli(["runs", "ls"], settings_for(seaweed, store, tmp_path, endpoint=endpoint)) == 2
    assert (
        capsys.readouterr().err
        == f"tempered runs: cannot reach S3 at {endpoint}: connection refused\n"
    )


def test_regrade_rescores_without_overwriting(
    seaweed: SeaweedServer,
    store: ObjectStore,
    demo_run: list[Trajectory],
    tmp_path: Path,
    capsys: Capture,
) -> None:
    pytest.importorskip("infra.sandbox.local", reason="local sandbox backend not written yet")
    settings = settings_for(seaweed, store, tmp_path)
    assert cli(["regrade", RUN, "--grader", "v2"], settings) == 0
    out = capsys.readouterr().out
    assert re.search(r"4\s*│\s*2\s*│\s*2\s*│\s*0\s*│\s*0\s*│\s*0", out), out
    records = {
        (t.task_id, t.sample): store.get_model(
            keys.reward_key(RUN, "v2", t.task_id, t.sample), RewardRecord
        )
        for t in demo_run
    }
    verdicts = [records[(t.task_id, t.sample)].solved for t in demo_run]
    assert verdicts == [True, True, True, False]
    assert records[(demo_run[0].task_id, 0)].previous_solved is False
    assert records[(demo_run[0].task_id, 0)].reward == 1.0
    prefix = f"runs/{RUN}/rewards/v2/"
    before = {key: store.head(key) for key in store.list_keys(prefix)}
    assert len(before) == 4
    assert cli(["regrade", RUN, "--grader", "v2"], settings) == 0  # rerun: identical, a no-op
    assert {key: store.head(key) for key in store.list_keys(prefix)} == before
