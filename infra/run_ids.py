"""Whether a run id is in use, read from the store: one home for the two ways it can be.

    if run_stored(store, "exp1"): ...          # objects under runs/exp1/
    record = removal_record(store, "exp1")     # removed/exp1.json, or None

A run id names one run for good: `tempered train` refuses a new run under an id that is in use
(`workers/cli/train.py`), the learner's `prepare_run` refuses a removed one, and `tempered runs`
refuses an id that names no run. Not covered: whether the run's workflow is running (Temporal's
to say).
"""

from __future__ import annotations

from contracts.common import ObjectRef
from infra import keys
from infra.storage import ObjectStore


def run_stored(store: ObjectStore, run: str) -> bool:
    """Whether any object is stored under run `run`'s prefix."""
    return next(iter(store.list_keys(keys.run_prefix(run))), None) is not None


def removal_record(store: ObjectStore, run: str) -> ObjectRef | None:
    """The record `tempered runs rm` wrote when it removed run `run` (the id is never used
    again: workers may still cache its policies under it), or None."""
    return store.head(keys.removed_run_key(run))
