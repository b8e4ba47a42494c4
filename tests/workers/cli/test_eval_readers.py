"""`tempered eval --run R --policy N` keeps version N from R's prunes while it evaluates, R still
training (a reader marker, `infra.retention.reading`).

Before, the run's prunes kept only the versions its own rollouts and evaluations read: with
`keep_versions` 2 an evaluation from the CLI lost its version two learner steps after it was
published, and its tasks failed at their first inference. Real SeaweedFS; the tasks' workflows
are not started: the prunes run where the tasks would, as the run's `prune_policies` would.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contracts.rollout import AgentTaskResult
from contracts.task import TaskSpec
from infra import keys
from infra.retention import prune_below
from infra.storage import ObjectStore
from tests.fixtures.cli_settings import cli_settings
from tests.infra.test_retention_bounds import publish_fakes, published
from tests.workers.cli.eval_setup import tasks_never_start
from workers.cli import evaluate, run

RUN = "training"
ARGV = ["eval", "--run", RUN, "--policy", "1", "--limit", "1", "--wait-for-workers"]


def test_the_version_an_eval_reads_outlives_the_runs_prunes_meanwhile(
    store: ObjectStore,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    publish_fakes(store, RUN, range(5))
    pruned: list[list[int]] = []

    def meanwhile(tasks: list[TaskSpec], version: int) -> None:
        pruned.append(prune_below(store, RUN, below=4, since=1))  # the run trains on meanwhile
        assert version in published(store, RUN, 5)

    tasks_never_start(monkeypatch, meanwhile)
    assert run(ARGV, cli_settings(tmp_path, store)) == 0, capsys.readouterr().err
    assert pruned == [[2, 3]]
    assert prune_below(store, RUN, below=4, since=4) == [1]  # the eval ended: its version goes
    assert published(store, RUN, 5) == [0, 4]


def test_an_eval_whose_version_went_before_it_was_marked_says_so(
    store: ObjectStore,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A prune deleted version 1 between the eval's first look and its marker: no task
    starts (each would fail at its first inference), and the message says what happened."""
    publish_fakes(store, RUN, range(3))
    load = evaluate._tasks

    def tasks_then_pruned(*args: Any) -> tuple[list[TaskSpec], str]:
        assert prune_below(store, RUN, below=2) == [1]
        return load(*args)

    async def evaluate_(*args: Any) -> list[AgentTaskResult]:
        raise AssertionError("a task started")

    monkeypatch.setattr(evaluate, "_tasks", tasks_then_pruned)
    monkeypatch.setattr(evaluate, "_evaluate", evaluate_)
    assert run(ARGV, cli_settings(tmp_path, store)) == 2
    err = capsys.readouterr().err
    assert f"run {RUN!r} has no policy version 1" in err and "deleted" in err, err
    assert prune_below(store, RUN, below=2, since=2) == []  # its marker goes with the next prune
    assert list(store.list_keys(keys.policy_readers_prefix(RUN))) == []
