"""Exactly-once accounting of a run, read from the object store alone.

    ledger = account(store, run_id, tasks=6, group_size=4)
    ledger.print("crash")          # the figures, visible with `pytest -s`
    ledger.assert_exactly_once()   # stored == tasks × G, none twice, each acked exactly once
    record_results("crash", {...}) # merged into bench/results.json under "crash"

What is checked: the trajectory documents under `runs/<run>/trajectories/` (one per task and
sample; each document's id, task and sample agree with its key; no (task, sample) twice), and
the learner's acks `runs/<run>/learner/step-*.json`: every stored trajectory id is listed exactly
once over all steps, in the step that was asked to train its group (with its whole group), as
one of
- trained: its tokens were in an update the optimizer applied (the step's record counts at
  least one row of the update per trained id);
- skipped, with the reason it gave no gradient (e.g. zero advantage);
- dropped as stale (counted apart: never "trained");
and nothing is acked that is not stored. tests/test_accounting.py breaks each rule on purpose.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from contracts.learner import StepRecord
from contracts.trajectory import Trajectory, trajectory_id
from infra import keys
from infra.storage import ObjectStore

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results.json"
COMPLETED = "WORKFLOW_EXECUTION_STATUS_COMPLETED"
_TRAJECTORY_NAME = re.compile(r"^(?P<task>.+)--s(?P<sample>\d+)\.json$")
_PROBLEMS = (
    "mismatched",
    "acked_twice",
    "never_acked",
    "acked_not_stored",
    "trained_without_update",
    "skipped_without_reason",
    "acked_outside_its_step",
    "groups_split",
)


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
    trained_without_update: list[str] = field(default_factory=list)  # step applied no such rows
    skipped_without_reason: list[str] = field(default_factory=list)
    acked_outside_its_step: list[str] = field(default_factory=list)  # its group was not asked
    groups_split: list[str] = field(default_factory=list)  # "step n: task" missing samples

    @property
    def expected(self) -> int:
        return self.tasks * self.group_size

    def figures(self) -> dict[str, Any]:
        data = asdict(self)
        for name in _PROBLEMS:
            data[name] = len(data[name])
        return {"expected": self.expected, **data}

    def print(self, label: str) -> None:
        f = self.figures()
        problems = ", ".join(f"{name.replace('_', ' ')} {f[name]}" for name in _PROBLEMS)
        print(
            f"\n[{label}] run {self.run_id}: tasks {f['tasks']}, trajectories expected "
            f"{f['expected']} stored {f['stored']}, duplicates {f['duplicates']}; learner steps "
            f"{f['steps']}, acked {f['acked']} (trained {f['trained']}, skipped {f['skipped']} "
            f"{f['skip_reasons']}, dropped stale {f['dropped_stale']}); {problems}"
        )

    def assert_stored_once(self) -> None:
        """Exactly tasks × G trajectories, none twice, each where its key says."""
        assert self.stored == self.expected, f"stored {self.stored} != {self.expected} expected"
        assert self.duplicates == 0, f"{self.duplicates} trajectories stored twice"
        assert not self.mismatched, f"documents disagree with their keys: {self.mismatched[:5]}"

    def assert_exactly_once(self) -> None:
        """`assert_stored_once`, and each trajectory acked exactly once, rightly filed."""
        self.assert_stored_once()
        assert not self.acked_twice, f"trained on more than once: {self.acked_twice[:5]}"
        assert not self.never_acked, f"never trained on: {self.never_acked[:5]}"
        assert not self.acked_not_stored, f"acked but not stored: {self.acked_not_stored[:5]}"
        assert not self.trained_without_update, (
            f"listed as trained by a step that applied no update for them: "
            f"{self.trained_without_update[:5]}"
        )
        assert not self.skipped_without_reason, (
            f"skipped without a reason: {self.skipped_without_reason[:5]}"
        )
        assert not self.acked_outside_its_step, (
            f"acked by a step not asked to train their group: {self.acked_outside_its_step[:5]}"
        )
        assert not self.groups_split, f"groups not acked whole: {self.groups_split[:5]}"
        assert self.acked == self.trained + self.skipped + self.dropped_stale


def stored_trajectories(store: ObjectStore, run_id: str) -> list[tuple[str, Trajectory]]:
    """(key, document) of every trajectory stored for the run."""
    prefix = keys.trajectories_prefix(run_id)
    return [
        (key, Trajectory.model_validate_json(store.get_bytes(key)))
        for key in store.list_keys(prefix)
    ]


def learner_acks(store: ObjectStore, run_id: str) -> list[StepRecord]:
    """The learner's step acks, in step order (not its other records, e.g. ledger segments)."""
    prefix = keys.learner_ack_key(run_id, 0).rsplit("-", 1)[0] + "-"  # runs/<run>/learner/step-
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
    pairs: set[tuple[str, int]] = set()
    ids: set[str] = set()
    for _, doc in documents:  # a document whose (task, sample) or id came before is a duplicate
        ledger.duplicates += (doc.task_id, doc.sample) in pairs or doc.id in ids
        pairs.add((doc.task_id, doc.sample))
        ids.add(doc.id)
    if acks:
        _check_acks(ledger, learner_acks(store, run_id), {doc.id: doc for _, doc in documents})
    return ledger


def _check_acks(ledger: Ledger, records: list[StepRecord], stored: dict[str, Trajectory]) -> None:
    ledger.steps = len(records)
    listed = Counter(i for r in records for i in (*r.trained, *r.skipped, *r.dropped_stale))
    ledger.trained = sum(len(r.trained) for r in records)
    ledger.skipped = sum(len(r.skipped) for r in records)
    ledger.skip_reasons = dict(Counter(why for r in records for why in r.skipped.values()))
    ledger.dropped_stale = sum(len(r.dropped_stale) for r in records)
    ledger.acked = sum(listed.values())
    ledger.acked_twice = sorted(i for i, n in listed.items() if n > 1)
    ledger.never_acked = sorted(set(stored) - set(listed))
    ledger.acked_not_stored = sorted(set(listed) - set(stored))
    for record in records:
        # every trained id has at least one row in the applied update (grpo.Row per turn)
        if record.trained and record.metrics.get("rows", 0) < len(record.trained):
            ledger.trained_without_update += record.trained
        ledger.skipped_without_reason += [i for i, why in record.skipped.items() if not why.strip()]
        in_step = {*record.trained, *record.skipped, *record.dropped_stale}
        asked = set(record.groups)
        ledger.acked_outside_its_step += sorted(
            i for i in in_step if i in stored and stored[i].task_id not in asked
        )
        for task in sorted(asked):
            group = {i for i, doc in stored.items() if doc.task_id == task}
            if not group or not group <= in_step:
                ledger.groups_split.append(f"step {record.step}: {task}")


def record_results(section: str, figures: dict[str, Any]) -> None:
    """Merge `figures` into bench/results.json under `section` (other sections kept)."""
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    results[section] = figures
    RESULTS.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
