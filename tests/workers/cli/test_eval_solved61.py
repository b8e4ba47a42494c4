"""`tempered eval`'s "solved" counts the tasks solved within the evaluation's turns, as its
"solve_rate" does; "solved_at_turn_1" those solved at the first (pass@1). It printed the turn-1
count as "solved" beside the solve rate of all turns (28/80 within two turns printed "solved":
23). Real Temporal dev server, SeaweedFS, sandbox and trajectory writer; only the model is
scripted: one task's program at the first turn, two others' at the second."""

from __future__ import annotations

import asyncio
import json

import pytest

from contracts.run import spread
from infra.settings import Settings
from infra.storage import ObjectStore
from infra.tasks import load_suite
from tests.workers.cli.eval_setup import RUN, Capture, recorded_run, workers
from tests.workers.cli.eval_setup import settings as settings  # a fixture
from tests.workflows.harness import ScriptedModel, connect, running_workers
from workers.cli import run


@pytest.mark.asyncio
@pytest.mark.timeout(120)
async def test_solved_counts_the_tasks_solved_within_the_turns(
    settings: Settings, store: ObjectStore, capsys: Capture
) -> None:
    spec = recorded_run(store)  # eval_max_turns 2, heldout_limit 4
    first, second, third, _ = spread(load_suite("starter", split="heldout"), spec.heldout_limit)
    programs = [t.canonical_solution or "" for t in (first, second, third)]
    assert all(programs)

    def script(sample: int, turn: int) -> str:
        # turn 0: `first` passes, the others fail; turn 1 (the three others): two of them pass
        return programs[0] if turn == 0 else "\n\n".join(programs[1:])

    model = ScriptedModel(store, script)
    client = await connect(settings.temporal.address, settings.temporal.namespace)
    async with running_workers(client, workers(settings, store, model)):
        argv = ["eval", "--run", RUN, "--policy", "0", "--wait-for-workers"]
        code = await asyncio.to_thread(run, argv, settings)
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out)
    assert (summary["tasks"], summary["turns"]) == (4, 2), summary
    assert (summary["pass_at_1"], summary["solve_rate"]) == (0.25, 0.75), summary
    assert summary["solved"] == 3, summary  # it printed 1, the tasks solved at turn 1
    assert summary["solved_at_turn_1"] == 1, summary
