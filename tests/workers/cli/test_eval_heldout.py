"""`tempered eval --run R` measures the held-out tasks R recorded when it started, not today's.

It rebuilt R's held-out set from the suite and quarantine list as they are today and `spread`
it: one task quarantined after a `tiny` run (20 held-out tasks) changed 10 of the 20 evaluated,
and a rewrite of the suite's held-out tasks changed them for every earlier run, without a word.
Now `prepare_run` records the set's ids and digests in run.json; the eval takes exactly those
tasks, refuses (exit 2, before any task) ones gone or changed since unless `--current-tasks`
asks for today's, and says so where a run.json of an earlier build records none. Real Temporal
dev server, real SeaweedFS, real sandbox and trajectory writer; only the model is scripted.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from activities.learner import LearnerActivities
from contracts.run import (
    HeldoutSet,
    PrepareRunRequest,
    RunRecord,
    TrainingRunInput,
    spread,
    task_digest,
)
from contracts.task import TaskSpec
from infra import keys
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import load_suite
from tests.fixtures.cli_settings import cli_settings
from tests.workers.cli.eval_setup import RUN, evaluate_with, quarantine, recorded_run, task_ids
from tests.workers.cli.eval_setup import settings as settings  # a fixture
from workers.cli import run
from workers.cli.runs import run_record

ONE_TURN = ["--run", RUN, "--policy", "0", "--max-turns", "1"]


async def prepared(store: ObjectStore, settings: Settings, heldout: list[TaskSpec]) -> None:
    """Run `RUN` as the training run records it: `prepare_run` with its input and held-out set."""
    spec = TrainingRunInput(run_id=RUN, suite="starter", heldout_limit=len(heldout))
    request = PrepareRunRequest(
        run_id=RUN, base_model="tiny", run=spec, heldout=HeldoutSet.of(heldout)
    )
    await ActivityEnvironment().run(LearnerActivities(settings, store).prepare_run, request)


@pytest.mark.asyncio
@pytest.mark.timeout(180)
async def test_eval_of_a_run_measures_the_heldout_tasks_it_recorded(
    settings: Settings, store: ObjectStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two tasks quarantined after the run, one of them in its set: today's `spread` picks three
    other tasks; the run's four are evaluated, the quarantined one among them, as the run did.
    `--current-tasks` takes today's."""
    heldout = load_suite("starter", split="heldout")
    recorded = spread(heldout, 4)
    await prepared(store, settings, recorded)
    quarantine(settings, recorded[0], heldout[1])
    today = spread([t for t in heldout if t not in (recorded[0], heldout[1])], 4)
    assert len({t.id for t in today} - {t.id for t in recorded}) == 3  # what a rebuild took

    code, calls, _, err = await evaluate_with(settings, store, ONE_TURN, capsys)
    assert code == 0, err
    assert task_ids(calls) == {t.id for t in recorded}
    assert f"the 4 held-out tasks run '{RUN}' recorded" in err
    assert f"1 of them quarantined since ({recorded[0].id})" in err

    code, calls, _, err = await evaluate_with(
        settings, store, [*ONE_TURN, "--current-tasks"], capsys
    )
    assert code == 0, err
    assert task_ids(calls) == {t.id for t in today}
    assert "4 of 78 heldout tasks of 'starter'" in err


def test_eval_refuses_a_recorded_task_gone_or_changed_since(
    store: ObjectStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task rewritten under its id, and one the suite no longer has: the run's figures cannot
    be reproduced, so nothing is evaluated (exit 2 before Temporal is reached), and the line
    says which tasks and how to evaluate today's set instead."""
    settings = cli_settings(tmp_path / "home", store)
    spec = recorded_run(store)
    heldout = spread(load_suite("starter", split="heldout"), 3)
    tasks = HeldoutSet.of(heldout).tasks | {"starter-gone-0": "0" * 16}
    tasks[heldout[1].id] = task_digest(heldout[1].model_copy(update={"prompt": "Old words."}))
    record = RunRecord.model_validate(spec.model_dump() | {"heldout": {"tasks": tasks}})
    store.put_json(keys.run_record_key(RUN), record)

    assert run(["eval", *ONE_TURN, "--wait-for-workers"], settings) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(
        f"tempered eval: 2 of the 4 held-out tasks run '{RUN}' recorded are not in suite "
        f"'starter' as they were: changed since: {heldout[1].id}; gone: starter-gone-0; "
    )
    assert "--current-tasks" in err

    assert run(["eval", "--policy", "tiny", "--current-tasks"], settings) == 2
    err = capsys.readouterr().err
    assert err.startswith("tempered eval: --current-tasks needs --run RUN"), err


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_a_run_recorded_without_its_heldout_set_rebuilds_it_and_says_so(
    settings: Settings, store: ObjectStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run.json of an earlier build (no held-out set): the set is today's, as before, with one
    line saying so."""
    spec = recorded_run(store)
    code, calls, _, err = await evaluate_with(settings, store, ONE_TURN, capsys)
    assert code == 0, err
    heldout = load_suite("starter", split="heldout")
    assert task_ids(calls) == {t.id for t in spread(heldout, spec.heldout_limit)}
    (note,) = [line for line in err.splitlines() if "recorded no held-out" in line]
    assert note == (
        f"tempered eval: run '{RUN}' recorded no held-out task ids (its run.json is from an "
        "earlier build): its held-out set is rebuilt from suite 'starter' and its quarantine "
        "list as they are today"
    )


@pytest.mark.asyncio
async def test_run_json_keeps_its_earlier_form_and_decodes_both(
    store: ObjectStore, tmp_path: Path
) -> None:
    """Without a held-out set `prepare_run` writes the bytes an earlier build wrote (a retry of
    an earlier build's attempt must find them the same: the write is create-only); with one,
    the set follows the input; both decode as the run's record."""
    settings = Settings(home=tmp_path / "home")
    acts, env = LearnerActivities(settings, store), ActivityEnvironment()
    spec = TrainingRunInput(run_id="old", heldout_limit=2)
    await env.run(acts.prepare_run, PrepareRunRequest(run_id="old", base_model="tiny", run=spec))
    assert store.get_bytes(keys.run_record_key("old")) == spec.model_dump_json().encode()
    old = run_record(store, "old")
    assert old is not None and old.heldout is None

    heldout = spread(load_suite("starter", split="heldout"), 2)
    new = spec.model_copy(update={"run_id": "new"})
    request = PrepareRunRequest(
        run_id="new", base_model="tiny", run=new, heldout=HeldoutSet.of(heldout)
    )
    await env.run(acts.prepare_run, request)
    stored = run_record(store, "new")
    assert stored is not None and stored.heldout is not None
    assert list(stored.heldout.tasks) == [t.id for t in heldout]
    assert stored.model_dump(exclude={"heldout"}) == new.model_dump()
