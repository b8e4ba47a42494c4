"""`tempered runs ls/show/rm` and `tempered regrade` on a small fabricated run in a real SeaweedFS."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from contracts.episode import EpisodeEnd, ToolCall
from contracts.learner import PolicyManifest, PolicyVersion
from contracts.run import TrainingRunInput, drawn_task
from contracts.sandbox import ExecStatus, ExecutionResult
from contracts.task import EnvName, TaskSpec
from contracts.trajectory import RewardRecord, Trajectory, TrajectoryStep
from infra import keys
from infra.base_models import TINY, materialize_base_model
from infra.policy import policy_manifest, publish_policy
from infra.policy_cache import BLOBS
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import load_suite
from tests.fixtures.cli_settings import cli_settings, nowhere, nowhere_endpoint
from tests.fixtures.s3 import SeaweedServer
from tests.trajectories import Step, trajectory
from workers.cli import run

RUN = "demo"
Capture = pytest.CaptureFixture[str]


def cli(argv: list[str], settings: Settings) -> int:
    return run(argv, settings)


def settings_for(server: SeaweedServer, store: ObjectStore, tmp_path: Path, **s3: Any) -> Settings:
    """The CLI's settings: `store`'s bucket of `server` (`s3` overriding some of its S3
    settings), home `tmp_path` (its policy cache under it)."""
    assert store.settings is server.settings
    return cli_settings(tmp_path, store, **s3)


@pytest.fixture
def settings(seaweed: SeaweedServer, store: ObjectStore, tmp_path: Path) -> Settings:
    return settings_for(seaweed, store, tmp_path)


def without_temporal(settings: Settings) -> Settings:
    """`settings` pointing at a Temporal that is not there (a free port nothing listens on)."""
    return settings.model_copy(update={"temporal": nowhere()})


def demo(task: TaskSpec, sample: int, code: str, solved: bool) -> Trajectory:
    status = ExecStatus.PASSED if solved else ExecStatus.FAILED
    return trajectory(
        [Step([1], [2], policy_version=sample, code=code, status=status)],
        reward=1.0 if solved else -0.1,
        run_id=RUN,
        task_id=task.id,
        sample=sample,
        group_size=2,
        solved=solved,
        created_at="2025-01-01T00:00:00Z",
        prompt=task.prompt,  # regrade skips a trajectory sampled from another prompt
    )


@pytest.fixture
def demo_run(store: ObjectStore) -> list[Trajectory]:
    """Two starter tasks × G=2. Recorded verdicts: sample 0 of the first task is recorded as
    failed although its final code is the canonical solution; sample 1 of the second task is
    recorded as solved although its code is the wrong solution. The other two are right. Their
    task ids are as the run drew them (`<id>-e<epoch>`), as a training run stores them."""
    order = load_suite("starter", split="train")[:2]
    first, second = drawn_task(order, 0), drawn_task(order, 1)
    assert first.canonical_solution and second.canonical_solution and second.wrong_solution
    stored = [
        demo(first, 0, first.canonical_solution, solved=False),
        demo(first, 1, first.canonical_solution, solved=True),
        demo(second, 0, second.canonical_solution, solved=True),
        demo(second, 1, second.wrong_solution, solved=True),
    ]
    store.put_json(keys.run_record_key(RUN), TrainingRunInput(run_id=RUN, group_size=2))
    for t in stored:
        store.put_json(keys.trajectory_key(RUN, t.task_id, t.sample), t)
        store.put_text(keys.turn_key(RUN, t.task_id, t.sample, 0, "code.py"), t.steps[0].code or "")
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


def test_runs_ls(settings: Settings, demo_run: list[Trajectory], capsys: Capture) -> None:
    assert cli(["runs", "ls"], settings) == 0
    out = capsys.readouterr().out
    assert re.search(r"demo\s*│\s*2\s*│\s*4\s*│\s*2\s*│\s*v1\s*│\s*-", out), out
    assert re.search(r"other\s*│\s*0\s*│\s*0\s*│\s*0\s*│\s*-", out), out


def test_runs_ls_lists_no_removed_run_and_counts_no_pruned_version(
    settings: Settings, store: ObjectStore, demo_run: list[Trajectory], capsys: Capture
) -> None:
    """SeaweedFS goes on listing a prefix whose objects are deleted: `runs ls` listed a run
    `runs rm` had removed, and counted the policy versions `runs prune` had deleted."""
    settings = without_temporal(settings)
    pruned = keys.policy_manifest_key(RUN, 2)
    store.put_text(pruned, "{}")
    store.delete(pruned)
    store.put_text("runs/gone/run.json", "{}")
    assert cli(["runs", "rm", "gone", "--force"], settings) == 0
    store.put_text("runs/half/run.json", "{}")  # an `rm` that stopped before the run's prefix
    store.put_text(keys.removed_run_key("half"), "{}")
    assert "runs/gone/" in list(store.list_prefixes(keys.RUNS_PREFIX))  # still listed
    capsys.readouterr()
    assert cli(["runs", "ls"], settings) == 0
    out = capsys.readouterr().out
    assert re.search(r"demo\s*│\s*2\s*│\s*4\s*│\s*2\s*│\s*v1\s*│\s*-", out), out
    assert "gone" not in out, out
    assert re.search(r"half \(removed in part\)\s*│", out), out


def test_runs_show(
    settings: Settings, store: ObjectStore, demo_run: list[Trajectory], capsys: Capture
) -> None:
    store.put_text(keys.policy_prefix(RUN, 2) + "weights.bin", "")  # no manifest
    assert cli(["runs", "show", RUN], settings) == 0
    out = capsys.readouterr().out
    assert "suite starter, base tiny, G=2" in out
    assert "no manifest (deleted, or a publish that never finished): v2" in out
    assert not re.search(r"v2\s*│", out), out
    assert "tasks 2  trajectories 4  mean reward +0.725  solved 3/4" in out
    first_task = demo_run[0].task_id
    assert re.search(
        rf"{re.escape(first_task)}\s*│\s*2\s*│\s*1/2\s*│\s*\+0\.450\s*│\s*1\s*│\s*0,1", out
    ), out
    assert re.search(r"v1\s*│\s*1\s*│\s*│\s*\*", out), out


def test_runs_show_task_prints_each_episode_step_by_step(
    settings: Settings, store: ObjectStore, capsys: Capture
) -> None:
    observations = [
        store.put_text("obs/0", "fixed.py: return a - b"),
        store.put_text("obs/1", "wrote fixed.py"),
        store.put_text("obs/2", "error: no tool call found"),
        store.put_text("obs/3", "submitted"),
    ]
    calls = [
        ToolCall(name="read_file", arguments={"path": "fixed.py"}),
        ToolCall(name="write_file", arguments={"path": "fixed.py", "content": "ok"}),
        ToolCall(error="no tool call found"),
        ToolCall(name="submit"),
    ]
    episode = trajectory(
        [Step([1, 2], [3]), Step([4], [5]), Step([6], [7]), Step([8], [9])],
        reward=1.0,
        run_id=RUN,
        task_id="ws-1",
        end=EpisodeEnd.SUBMITTED,
    )
    verifier = store.put_json(
        "verdict.json", ExecutionResult(status=ExecStatus.PASSED, tests_passed=3, tests_total=3)
    )
    steps: list[TrajectoryStep] = [
        s.model_copy(update={"call": c, "observation": o, "code": None, "status": None})
        for s, c, o in zip(episode.steps, calls, observations, strict=True)
    ]
    steps[2].completion_text = "I think the bug is in line 2."
    episode = episode.model_copy(
        update={"env": EnvName.WORKSPACE, "steps": steps, "verifier": verifier}
    )
    store.put_json(keys.trajectory_key(RUN, "ws-1", 0), episode)
    assert cli(["runs", "show", RUN, "--task", "ws-1"], settings) == 0
    out = capsys.readouterr().out
    assert "ws-1 sample 0: 4 steps, ended submitted, reward +1.000, solved" in out
    assert 'read_file({"path": "fixed.py"})' in out and "fixed.py: return a - b" in out
    assert 'write_file({"path": "fixed.py", "content": "ok"})' in out
    assert "no valid call (no tool call found); the model wrote:" in out
    assert "I think the bug is in line 2." in out and "submit({})" in out
    assert "verifier: passed, 3/3 hidden tests" in out
    assert out.index("step 0") < out.index("step 1") < out.index("step 3")
    assert cli(["runs", "show", RUN, "--task", "ws-1", "--sample", "3"], settings) == 2
    assert "has no trajectory of task 'ws-1' sample 3" in capsys.readouterr().err


def test_runs_prune_keeps_v0_and_the_newest_versions(
    settings: Settings, store: ObjectStore, tmp_path: Path, capsys: Capture
) -> None:
    tiny = materialize_base_model(TINY, Settings(home=tmp_path / "models"))
    for version in range(4):
        publish_policy(store, "prune-me", version, tiny, step=version)
    settings = without_temporal(settings)
    assert cli(["runs", "prune", "prune-me", "--keep", "1"], settings) == 2  # may still run
    assert "nothing pruned (--force anyway)" in capsys.readouterr().err
    assert policy_manifest(store, "prune-me", 1) is not None
    assert cli(["runs", "prune", "prune-me", "--keep", "1", "--force"], settings) == 0
    assert "deleted policy versions v1, v2, the workspace snapshots" in capsys.readouterr().out
    left = [v for v in range(4) if policy_manifest(store, "prune-me", v) is not None]
    assert left == [0, 3]
    with pytest.raises(SystemExit) as refused:  # at parse time, as every bad number is
        cli(["runs", "prune", "prune-me", "--keep", "-1", "--force"], settings)
    assert refused.value.code == 2 and "-1 is not 0 or more" in capsys.readouterr().err


def test_runs_rm_deletes_a_run_its_evaluations_and_its_cached_policies_only(
    settings: Settings,
    store: ObjectStore,
    demo_run: list[Trajectory],
    tmp_path: Path,
    capsys: Capture,
) -> None:
    for key in (
        "runs/demo-eval-v0/a",
        "runs/demo-eval-v12/b",
        "runs/demo-eval-v3-humaneval/e",  # `tempered eval --suite humaneval`
        "runs/demo-eval-vx/c",
        "runs/demo2/d",
    ):
        store.put_text(key, "x")
    cached = tmp_path / "cache" / "policies" / RUN / "v1"  # as infra.policy_cache lays it out
    blob = tmp_path / "cache" / "policies" / BLOBS / ("ab" * 32)
    cached.mkdir(parents=True)
    blob.parent.mkdir()
    blob.write_bytes(b"weights")
    os.link(blob, cached / "model-layer-0000.safetensors")
    settings = without_temporal(settings)
    before = sorted(store.list_keys(keys.RUNS_PREFIX))

    assert cli(["runs", "rm", RUN], settings) == 2  # Temporal cannot say whether it runs
    assert "nothing deleted (--force anyway)" in capsys.readouterr().err
    assert sorted(store.list_keys(keys.RUNS_PREFIX)) == before and cached.exists()

    assert cli(["runs", "rm", RUN, "--force"], settings) == 0
    assert "deleted run demo: 15 objects (3 evaluations)" in capsys.readouterr().out
    assert sorted(store.list_keys(keys.RUNS_PREFIX)) == [
        "runs/demo-eval-vx/c",
        "runs/demo2/d",
        "runs/other/run.json",
    ]
    assert not (tmp_path / "cache" / "policies" / RUN).exists() and not blob.exists()
    assert store.exists(keys.removed_run_key(RUN))  # the id is not used again (prepare_run)
    assert cli(["runs", "rm", RUN, "--force"], settings) == 0  # a rerun: nothing left
    assert "run demo was removed already (removed/demo.json)" in capsys.readouterr().out
    assert cli(["runs", "show", RUN], settings) == 2  # gone: an unknown run now
    assert "unknown run 'demo'" in capsys.readouterr().err


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
    endpoint = nowhere_endpoint()
    assert cli(["runs", "ls"], settings_for(seaweed, store, tmp_path, endpoint=endpoint)) == 2
    assert (
        capsys.readouterr().err
        == f"tempered runs: cannot reach S3 at {endpoint}: connection refused\n"
    )


def test_regrade_rescores_without_overwriting(
    settings: Settings, store: ObjectStore, demo_run: list[Trajectory], capsys: Capture
) -> None:
    pytest.importorskip("infra.sandbox.local", reason="local sandbox backend not written yet")
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
    capsys.readouterr()
    assert cli(["runs", "show", RUN], settings) == 0
    assert re.search(r"v2\s*│\s*4\s*│\s*3/4\s*│\s*\+0\.725\s*│\s*2", capsys.readouterr().out)


def test_cli_regrade_counts_the_turns_a_cut_episode_never_took(
    settings: Settings, store: ObjectStore
) -> None:
    """The command hands the run's max_turns to the regrade: the workflow scored this episode
    -0.3 (two turns never taken), and so does the regrade."""
    task = drawn_task(load_suite("starter", split="train")[:1], 0)
    assert task.wrong_solution
    cut = trajectory(
        [Step([1], [2], code=task.wrong_solution, status=ExecStatus.FAILED)],
        reward=-0.3,
        run_id="cutrun",
        task_id=task.id,
        sample=0,
        group_size=1,
        solved=False,
        end=EpisodeEnd.CONTEXT_BUDGET,
        prompt=task.prompt,
    )
    store.put_json(keys.run_record_key("cutrun"), TrainingRunInput(run_id="cutrun", max_turns=3))
    store.put_json(keys.trajectory_key("cutrun", cut.task_id, 0), cut)
    assert cli(["regrade", "cutrun", "--grader", "v2"], settings) == 0
    record = store.get_model(keys.reward_key("cutrun", "v2", task.id, 0), RewardRecord)
    assert not record.solved and record.reward == pytest.approx(-0.3)
