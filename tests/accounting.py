"""Exactly-once accounting of a run, read from the object store alone.

    ledger = account(store, run_id, tasks=6, group_size=4)
    ledger.print("crash")          # the figures, visible with `pytest -s`
    ledger.assert_exactly_once()   # stored == tasks × G, none twice, each acked exactly once
    record_results("crash", {...}) # merged into bench/results.json under "crash"

What is checked: the trajectory documents under `runs/<run>/trajectories/` (one per task and
sample; each document's id, task and sample agree with its key; no (task, sample) twice), and
the learner's acks `runs/<run>/learner/step-*.json` (every stored trajectory id listed exactly
once over all steps: as trained — its tokens were in an update the optimizer applied —, as
skipped with a reason, or as dropped for staleness; nothing acked that is not stored).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contracts.learner import StepRecord
from contracts.trajectory import Trajectory, trajectory_id
from infra import keys
from infra.storage import ObjectStore

if TYPE_CHECKING:
    from tests.fixtures.stack import Stack

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results.json"
COMPLETED = "WORKFLOW_EXECUTION_STATUS_COMPLETED"
_TRAJECTORY_NAME = re.compile(r"^(?P<task>.+)--s(?P<sample>\d+)\.json$")


@dataclass
class Ledger:
    run_id: str
    tasks: int
    group_size: int
    stored: int = 0
    duplicates: int = 0  # (task, sample) or trajectory id stored more than once
    mismatched: list[str] = field(default_factory=list)  # document disagrees with its key
    steps: int = 0
    acked: int = 0  # ids listed over all acks (trained + skipped + dropped as stale)
    trained: int = 0  # in an update the optimizer applied
    skipped: int = 0  # listed with the reason they gave no gradient (e.g. zero advantage)
    dropped_stale: int = 0
    skip_reasons: dict[str, int] = field(default_factory=dict)
    acked_twice: list[str] = field(default_factory=list)
    never_acked: list[str] = field(default_factory=list)
    acked_not_stored: list[str] = field(default_factory=list)

    @property
    def expected(self) -> int:
        return self.tasks * self.group_size

    def figures(self) -> dict[str, Any]:
        data = asdict(self)
        for name in ("mismatched", "acked_twice", "never_acked", "acked_not_stored"):
            data[name] = len(data[name])
        return {"expected": self.expected, **data}

    def print(self, label: str) -> None:
        f = self.figures()
        print(
            f"\n[{label}] run {self.run_id}: tasks {f['tasks']}, trajectories expected "
            f"{f['expected']} stored {f['stored']}, duplicates {f['duplicates']}, mismatched "
            f"{f['mismatched']}; learner steps {f['steps']}, acked {f['acked']} (trained "
            f"{f['trained']}, skipped {f['skipped']} {f['skip_reasons']}, dropped stale "
            f"{f['dropped_stale']}), acked twice "
            f"{f['acked_twice']}, never acked {f['never_acked']}, acked but not stored "
            f"{f['acked_not_stored']}"
        )

    def assert_exactly_once(self) -> None:
        assert self.stored == self.expected, f"stored {self.stored} != {self.expected} expected"
        assert self.duplicates == 0, f"{self.duplicates} trajectories stored twice"
        assert not self.mismatched, f"documents disagree with their keys: {self.mismatched[:5]}"
        assert not self.acked_twice, f"trained on more than once: {self.acked_twice[:5]}"
        assert not self.never_acked, f"never trained on: {self.never_acked[:5]}"
        assert not self.acked_not_stored, f"acked but not stored: {self.acked_not_stored[:5]}"
        assert self.acked == self.trained + self.skipped + self.dropped_stale


def stored_trajectories(store: ObjectStore, run_id: str) -> list[tuple[str, Trajectory]]:
    """(key, document) of every trajectory stored for the run."""
    prefix = keys.trajectories_prefix(run_id)
    return [
        (key, Trajectory.model_validate_json(store.get_bytes(key)))
        for key in store.list_keys(prefix)
    ]


def learner_acks(store: ObjectStore, run_id: str) -> list[StepRecord]:
    prefix = keys.learner_ack_key(run_id, 0).rsplit("/", 1)[0] + "/"
    return [store.get_model(key, StepRecord) for key in sorted(store.list_keys(prefix))]


def account(
    store: ObjectStore, run_id: str, tasks: int, group_size: int, *, acks: bool = True
) -> Ledger:
    """The ledger of `run_id`; `acks=False` for runs without a learner (agent tasks only)."""
    ledger = Ledger(run_id=run_id, tasks=tasks, group_size=group_size)
    documents = stored_trajectories(store, run_id)
    ledger.stored = len(documents)
    prefix = keys.trajectories_prefix(run_id)
    for key, doc in documents:
        name = _TRAJECTORY_NAME.match(key.removeprefix(prefix))
        expected_id = trajectory_id(run_id, doc.task_id, doc.sample)
        if (
            name is None
            or name["task"] != doc.task_id
            or int(name["sample"]) != doc.sample
            or doc.id != expected_id
            or doc.run_id != run_id
        ):
            ledger.mismatched.append(key)
    pairs = Counter((doc.task_id, doc.sample) for _, doc in documents)
    ids = Counter(doc.id for _, doc in documents)
    ledger.duplicates = sum(n - 1 for n in pairs.values()) + sum(n - 1 for n in ids.values())
    if not acks:
        return ledger
    records = learner_acks(store, run_id)
    ledger.steps = len(records)
    listed = Counter(i for r in records for i in (*r.trained, *r.skipped, *r.dropped_stale))
    ledger.trained = sum(len(r.trained) for r in records)
    ledger.skipped = sum(len(r.skipped) for r in records)
    ledger.skip_reasons = dict(Counter(why for r in records for why in r.skipped.values()))
    ledger.dropped_stale = sum(len(r.dropped_stale) for r in records)
    ledger.acked = sum(listed.values())
    ledger.acked_twice = sorted(i for i, n in listed.items() if n > 1)
    ledger.never_acked = sorted(set(ids) - set(listed))
    ledger.acked_not_stored = sorted(set(listed) - set(ids))
    return ledger


def record_results(section: str, figures: dict[str, Any]) -> None:
    """Merge `figures` into bench/results.json under `section` (other sections kept)."""
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    results[section] = figures
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


def check_training_run(
    stack: Stack,
    label: str,
    workflow_id: str,
    run_id: str,
    tasks: int,
    group_size: int,
    faults: list[dict[str, Any]],
    started: float,
) -> Ledger:
    """Wait for a training run, check it end to end, print and record its figures."""
    status = stack.wait_closed(workflow_id, timeout_s=600)
    assert status == COMPLETED, f"{workflow_id}: {status}\n{stack.worker_logs()}"
    result = stack.result(workflow_id)
    ledger = account(stack.store(), run_id, tasks=result["tasks_started"], group_size=group_size)
    wall_s = round(time.monotonic() - started, 1)
    ledger.print(label)
    print(f"[{label}] wall time {wall_s}s; faults: {faults}")
    record_results(
        label,
        {
            **ledger.figures(),
            "wall_s": wall_s,
            "faults": faults,
            "steps": result["steps"],
            "tasks_done": result["tasks_done"],
            "tasks_started": result["tasks_started"],
        },
    )
    assert not stack.dead_workers(), f"workers died: {stack.dead_workers()}"
    assert result["tasks_started"] == tasks, f"started {result['tasks_started']} of {tasks}"
    assert result["tasks_done"] == result["tasks_started"], "a task never reached DONE"
    assert result["steps"] == len(result["history"]) == ledger.steps
    ledger.assert_exactly_once()
    return ledger
