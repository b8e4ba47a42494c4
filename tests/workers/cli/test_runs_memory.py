"""`tempered runs show` and `tempered regrade` read a run's trajectories one at a time (real
SeaweedFS): their peak memory does not grow with the number of trajectories. Each held every
trajectory at once, token ids, mask and log-probs included (~330 kB for 4,096 tokens), so a
run of 100k trajectories needed tens of GB."""

from __future__ import annotations

import re
import tracemalloc
from pathlib import Path

import pytest

from contracts.run import draw_order, drawn_task
from contracts.task import EnvName
from infra import keys
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import load_suite
from tests.fixtures.s3 import SeaweedServer
from tests.trajectories import Step, trajectory
from workers.cli import run

TOKENS = 2048
TASKS = 4


def stored_run(store: ObjectStore, run_id: str, count: int) -> None:
    """`count` episodes of `TASKS` drawn starter tasks, `TOKENS` tokens each: workspace
    episodes, which regrade reads and skips (their verifier grades them) without a sandbox."""
    order = draw_order(load_suite("starter", split="train")[:TASKS], 0)
    for index in range(count):
        task = drawn_task(order, index % TASKS)
        episode = trajectory(
            [Step(list(range(TOKENS - 8)), [1] * 8, policy_version=index % 3)],
            reward=float(index % 2),
            run_id=run_id,
            task_id=task.id,
            sample=index // TASKS,
            solved=index % 2 == 1,
            prompt=task.prompt,
        ).model_copy(update={"env": EnvName.WORKSPACE})
        store.put_json(keys.trajectory_key(run_id, task.id, episode.sample), episode)


def peak(argv: list[str], settings: Settings, capsys: pytest.CaptureFixture[str]) -> int:
    """Peak bytes traced while the command ran (its output checked, then dropped)."""
    tracemalloc.start()
    try:
        code = run(argv, settings)
        _, top = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    out = capsys.readouterr().out
    if argv[0] == "runs":
        assert code == 0
        assert re.search(r"trajectories (\d+)  mean reward \+0\.500  solved", out), out
    else:  # every one read and skipped, none regraded
        assert code == 1 and re.search(r"│\s*0\s*│\s*0\s*│\s*0\s*│\s*0\s*│\s*\d+\s*│\s*0", out)
    return top


@pytest.mark.parametrize("argv", [["runs", "show"], ["regrade"]], ids=["show", "regrade"])
def test_peak_memory_does_not_grow_with_the_trajectories(
    seaweed: SeaweedServer,
    store: ObjectStore,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    settings = Settings(
        home=tmp_path,
        s3=seaweed.settings.model_copy(update={"bucket": store.bucket}),
        sandbox={"local": {"warm": 0}},  # regrade runs no program here: none started ahead
    )
    few, many = 16, 64
    stored_run(store, "few", few)
    stored_run(store, "many", many)
    peak([*argv, "few"], settings, capsys)  # imports and clients made once: not counted
    small = peak([*argv, "few"], settings, capsys)
    large = peak([*argv, "many"], settings, capsys)
    # held all at once, each adds ~160 kB: 7.7 MB for the 48 more (botocore's S3 model, read
    # again by each command's client, is most of `small`)
    grew = large - small
    assert grew < 2e6, f"{few}: {small / 1e6:.1f} MB, {many}: {large / 1e6:.1f} MB"
