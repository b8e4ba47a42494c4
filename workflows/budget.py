"""When a long-lived workflow continues as new: one rule for `LearnerWorkflow` and
`TrainingRunWorkflow`, against the `HistoryBudget` in their input.

Temporal fails a run whose history passes 51,200 events or 50 MiB; a budget is a fraction of
those (20% by default). `spent` looks ahead: a caller that has work in flight which will still
add events (children that have yet to finish) counts them, so continuing as new once they are
done keeps the whole run inside the budget.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from contracts.learner import HistoryBudget


def spent(budget: HistoryBudget, *, ahead_events: int = 0, ahead_bytes: int = 0) -> bool:
    """Whether this run's history, plus what is still to come, reaches `budget`."""
    info = workflow.info()
    return (
        info.get_current_history_length() + ahead_events >= budget.events
        or info.get_current_history_size() + ahead_bytes >= budget.bytes
    )
